/* Unit tests: a channel's producer queue (plugin/pqueue): items own their reply and Nats-Msg-Id
 * copies, FIFO order, the count and byte bounds (refused, not taken), a closed queue,
 * requeueing at the head keeping the order of the items given back, and ending an item: its
 * completion hook gets it with the result (a dead letter goes back to its claim), an item
 * without a hook is freed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "pqueue.h"

/* Every structural invariant: n and bytes match the list, tail is its last item. */
static void check(dm_pq *q)
{
    size_t n = 0, bytes = 0;
    pq_item *last = NULL;
    for (pq_item *it = q->head; it; it = it->next) {
        n++;
        bytes += it->rec_len;
        last = it;
    }
    assert_int_equal(n, q->n);
    assert_int_equal(bytes, q->bytes);
    assert_ptr_equal(last, q->tail);
}

static pq_item *take(dm_pq *q)
{
    pthread_mutex_lock(&q->mu);
    pq_item *it = dm_pq_take_locked(q);
    pthread_mutex_unlock(&q->mu);
    return it;
}

static void pqueue_item_owns_its_strings(void **state)
{
    (void)state;
    char reply[] = "_INBOX.r1", id[] = "order-7";
    pq_item *it = dm_pq_item_new_id(PQ_CAPTURE, reply, id, 5);
    assert_non_null(it);
    reply[0] = id[0] = 'X'; /* copies, not the caller's buffers */
    assert_string_equal(it->reply, "_INBOX.r1");
    assert_string_equal(it->msgid, "order-7");
    assert_int_equal(it->kind, PQ_CAPTURE);
    assert_int_equal(it->rec_len, 5);
    memcpy(it->rec, "hello", 5); /* rec_len bytes are writable (valgrind, ASan) */
    assert_null(it->next);
    assert_null(it->claim);
    assert_true(it->in_ms > 0);
    dm_pq_item_free(it);

    it = dm_pq_item_new(PQ_DEADLETTER, NULL, 0);
    assert_non_null(it);
    assert_null(it->reply);
    assert_null(it->msgid);
    assert_int_equal(it->kind, PQ_DEADLETTER);
    dm_pq_item_free(it);
}

static void pqueue_fifo_and_count_cap(void **state)
{
    (void)state;
    dm_pq q;
    dm_pq_init(&q);
    assert_null(take(&q));
    pq_item **items = calloc(FX_DM_CAPQ_MAX_MSGS + 1, sizeof *items);
    assert_non_null(items);
    for (size_t i = 0; i <= FX_DM_CAPQ_MAX_MSGS; i++) {
        items[i] = dm_pq_item_new(PQ_CAPTURE, NULL, 1);
        assert_non_null(items[i]);
        items[i]->rec[0] = (uint8_t)i;
    }
    for (size_t i = 0; i < FX_DM_CAPQ_MAX_MSGS; i++) assert_true(dm_pq_push(&q, items[i]));
    /* full by count: refused, not taken (the caller still owns it) */
    assert_false(dm_pq_push(&q, items[FX_DM_CAPQ_MAX_MSGS]));
    assert_null(items[FX_DM_CAPQ_MAX_MSGS]->next);
    assert_int_equal(q.n, FX_DM_CAPQ_MAX_MSGS);
    assert_int_equal(q.bytes, FX_DM_CAPQ_MAX_MSGS);
    check(&q);
    /* FIFO: taken in push order */
    for (size_t i = 0; i < FX_DM_CAPQ_MAX_MSGS; i++) {
        pq_item *it = take(&q);
        assert_ptr_equal(it, items[i]);
        assert_null(it->next);
        if (i % 4096 == 0) check(&q);
    }
    assert_null(take(&q));
    assert_int_equal(q.n, 0);
    assert_int_equal(q.bytes, 0);
    assert_null(q.head);
    assert_null(q.tail);
    /* room again after taking */
    assert_true(dm_pq_push(&q, items[FX_DM_CAPQ_MAX_MSGS]));
    assert_ptr_equal(take(&q), items[FX_DM_CAPQ_MAX_MSGS]);
    for (size_t i = 0; i <= FX_DM_CAPQ_MAX_MSGS; i++) dm_pq_item_free(items[i]);
    free(items);
    dm_pq_destroy(&q);
}

/* The byte bound counts rec_len only; the items need not be that large (stack items). */
static void pqueue_byte_bound(void **state)
{
    (void)state;
    dm_pq q;
    dm_pq_init(&q);
    pq_item big = {.rec_len = FX_DM_CAPQ_MAX_BYTES - 10}, over = {.rec_len = 11},
            fits = {.rec_len = 10}, small = {.rec_len = 1},
            huge = {.rec_len = FX_DM_CAPQ_MAX_BYTES + 1};
    assert_true(dm_pq_push(&q, &big));
    assert_false(dm_pq_push(&q, &over)); /* one byte past the bound */
    assert_int_equal(q.n, 1);
    assert_int_equal(q.bytes, FX_DM_CAPQ_MAX_BYTES - 10);
    assert_true(dm_pq_push(&q, &fits)); /* exactly at the bound */
    assert_int_equal(q.bytes, FX_DM_CAPQ_MAX_BYTES);
    assert_false(dm_pq_push(&q, &small));
    check(&q);
    assert_ptr_equal(take(&q), &big);
    assert_true(dm_pq_push(&q, &small)); /* room once the big one is taken */
    assert_ptr_equal(take(&q), &fits);
    assert_ptr_equal(take(&q), &small);
    /* an empty queue takes one item of any size; nothing fits beside it */
    assert_true(dm_pq_push(&q, &huge));
    assert_false(dm_pq_push(&q, &small));
    assert_ptr_equal(take(&q), &huge);
    check(&q);
    /* a closed queue refuses everything */
    q.closed = true;
    assert_false(dm_pq_push(&q, &small));
    assert_int_equal(q.n, 0);
    dm_pq_destroy(&q);
}

static void pqueue_requeue_front_keeps_order(void **state)
{
    (void)state;
    dm_pq q;
    dm_pq_init(&q);
    pq_item it[6];
    memset(it, 0, sizeof it);
    for (size_t i = 0; i < 6; i++) {
        it[i].rec_len = 100 + i;
        assert_true(dm_pq_push(&q, &it[i]));
    }
    /* a batch of the first three is taken, then given back (a put worker whose producer
     * closed): the queue reads 0 1 2 3 4 5 again */
    pq_item *back[3];
    for (size_t i = 0; i < 3; i++) back[i] = take(&q);
    assert_int_equal(q.n, 3);
    dm_pq_requeue_front(&q, back, 3);
    check(&q);
    assert_int_equal(q.n, 6);
    for (size_t i = 0; i < 6; i++) assert_ptr_equal(take(&q), &it[i]);
    assert_null(q.tail);

    /* given back into an empty queue (tail set), then pushed behind: 1 3 then 5 */
    back[0] = &it[1];
    back[1] = &it[3];
    pthread_mutex_lock(&q.mu);
    dm_pq_requeue_front_locked(&q, back, 2);
    pthread_mutex_unlock(&q.mu);
    assert_ptr_equal(q.tail, &it[3]);
    assert_true(dm_pq_push(&q, &it[5]));
    check(&q);
    assert_ptr_equal(take(&q), &it[1]);
    assert_ptr_equal(take(&q), &it[3]);
    assert_ptr_equal(take(&q), &it[5]);
    dm_pq_requeue_front(&q, back, 0); /* nothing */
    assert_null(q.head);

    /* no bound check on requeue: items taken from a full queue go back even after a push
     * refilled it */
    pq_item *items = calloc(FX_DM_CAPQ_MAX_MSGS + 1, sizeof *items);
    assert_non_null(items);
    for (size_t i = 0; i < FX_DM_CAPQ_MAX_MSGS; i++) assert_true(dm_pq_push(&q, &items[i]));
    pq_item *first = take(&q);
    assert_true(dm_pq_push(&q, &items[FX_DM_CAPQ_MAX_MSGS]));
    dm_pq_requeue_front(&q, &first, 1);
    assert_int_equal(q.n, FX_DM_CAPQ_MAX_MSGS + 1);
    assert_ptr_equal(q.head, &items[0]);
    check(&q);
    while (take(&q)) {
    }
    free(items);
    dm_pq_destroy(&q);
}

static int hook_calls;
static fx_err hook_result;
static pq_item *hook_item;

static void hook(pq_item *it, fx_err e)
{
    hook_calls++;
    hook_result = e;
    assert_int_equal(it->result, e);
    hook_item = it;
    free(it); /* the hook takes the item */
}

static void pqueue_item_done_runs_its_hook(void **state)
{
    (void)state;
    hook_calls = 0;
    pq_item *it = dm_pq_item_new(PQ_DEADLETTER, NULL, 4);
    assert_non_null(it);
    it->done = hook;
    dm_pq_item_done(it, FX_ECLOSED);
    assert_int_equal(hook_calls, 1);
    assert_int_equal(hook_result, FX_ECLOSED);
    assert_ptr_equal(hook_item, it);
    pq_item *plain = dm_pq_item_new(PQ_CAPTURE, "r", 4);
    assert_non_null(plain);
    dm_pq_item_done(plain, FX_OK); /* no hook: freed (valgrind and ASan see a leak otherwise) */
    assert_int_equal(hook_calls, 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(pqueue_item_owns_its_strings),
        cmocka_unit_test(pqueue_fifo_and_count_cap),
        cmocka_unit_test(pqueue_byte_bound),
        cmocka_unit_test(pqueue_requeue_front_keeps_order),
        cmocka_unit_test(pqueue_item_done_runs_its_hook),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
