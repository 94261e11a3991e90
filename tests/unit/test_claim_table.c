/* Unit tests: the in-flight table of a claim (bridge/claim_table): hash by claim seq, min-heap by
 * due time, growth, the cap, ownership of the deliveries. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "claim_table.h"

/* Every structural invariant: heap order and positions, hash chains holding exactly the hashed
 * live entries, the free list and the counters. */
static void check(const ctab *t)
{
    assert_true(t->heap_n <= t->n_ents);
    for (uint32_t i = 0; i < t->heap_n; i++) {
        uint32_t idx = t->heap[i];
        assert_true(idx < t->n_ents);
        assert_int_equal(t->ents[idx].heap_pos, (int32_t)i);
        if (i > 0) assert_true(t->ents[t->heap[(i - 1) / 2]].due_ms <= t->ents[idx].due_ms);
    }
    uint32_t used = 0, scheduled = 0, hashed = 0;
    for (uint32_t i = 0; i < t->n_ents; i++) {
        const ctab_ent *e = &t->ents[i];
        if (e->state != E_FREE) used++;
        if (e->heap_pos >= 0) {
            scheduled++;
            assert_true((uint32_t)e->heap_pos < t->heap_n);
            assert_int_equal(t->heap[e->heap_pos], i);
        }
        if (e->hashed) hashed++;
    }
    assert_int_equal(scheduled, t->heap_n);
    assert_int_equal(used, t->n_used);
    assert_int_equal(t->n_used + t->n_free, t->n_ents);
    uint32_t chained = 0;
    for (uint32_t b = 0; b <= t->nb_mask; b++)
        for (uint32_t i = t->buckets[b]; i != CTAB_NIL; i = t->ents[i].hnext) {
            assert_true(i < t->n_ents);
            assert_true(t->ents[i].hashed);
            assert_int_equal(t->ents[i].claim_seq & t->nb_mask, b);
            chained++;
        }
    assert_int_equal(chained, hashed);
}

/* A live entry with claim seq cseq (hashed) due at due, holding a delivery of its own. */
static uint32_t add(ctab *t, uint64_t cseq, int64_t due)
{
    uint32_t idx = ctab_alloc(t);
    if (idx == CTAB_NIL) return idx;
    ctab_ent *e = &t->ents[idx];
    e->state = E_WAIT_ACK;
    e->claim_seq = cseq;
    e->dv.value.len = 16;
    e->dv.value.data = malloc(e->dv.value.len); /* freed by the table: leaks show under valgrind */
    assert_non_null(e->dv.value.data);
    ctab_hash(t, idx);
    ctab_schedule(t, idx, due);
    return idx;
}

/* Take the entry due first out of the heap; its due time. */
static int64_t pop(ctab *t, uint32_t *idx_out)
{
    uint32_t idx = ctab_next(t);
    assert_int_not_equal(idx, CTAB_NIL);
    int64_t due = t->ents[idx].due_ms;
    ctab_unschedule(t, idx);
    if (idx_out) *idx_out = idx;
    return due;
}

static uint64_t rng = 0x9e3779b97f4a7c15u;
static uint64_t next_rand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static void claim_table_insert_find_remove(void **state)
{
    (void)state;
    ctab t;
    assert_true(ctab_init(&t, 1000, NULL, NULL));
    assert_int_equal(ctab_next(&t), CTAB_NIL);
    assert_int_equal(ctab_find(&t, 1), CTAB_NIL);
    uint32_t a = add(&t, 1, 300), b = add(&t, 2, 100), c = add(&t, 3, 200);
    assert_int_not_equal(a, CTAB_NIL);
    assert_int_equal(t.n_used, 3);
    assert_int_equal(ctab_find(&t, 1), a);
    assert_int_equal(ctab_find(&t, 2), b);
    assert_int_equal(ctab_find(&t, 3), c);
    assert_int_equal(ctab_find(&t, 4), CTAB_NIL);
    assert_int_equal(ctab_next(&t), b);
    uint64_t ga = t.ents[a].gen, gb = t.ents[b].gen, gc = t.ents[c].gen;
    assert_true(ga && ga != gb && gb != gc && ga != gc);
    check(&t);

    ctab_release(&t, b);
    check(&t);
    assert_int_equal(t.ents[b].state, E_FREE);
    assert_null(t.ents[b].dv.value.data); /* the delivery went with it */
    assert_int_equal(ctab_find(&t, 2), CTAB_NIL);
    assert_int_equal(ctab_next(&t), c);
    assert_int_equal(t.n_used, 2);
    ctab_release(&t, b); /* releasing a free entry: no-op */
    assert_int_equal(t.n_used, 2);
    check(&t);

    /* the slot comes back with a new generation (stale references detect reuse) */
    uint32_t d = add(&t, 4, 50);
    assert_int_equal(d, b);
    assert_true(t.ents[d].gen > gc);
    assert_int_equal(ctab_next(&t), d);

    /* a new claim seq: unhash, change, hash */
    ctab_unhash(&t, a);
    ctab_unhash(&t, a); /* twice: no-op */
    assert_int_equal(ctab_find(&t, 1), CTAB_NIL);
    t.ents[a].claim_seq = 99;
    ctab_hash(&t, a);
    assert_int_equal(ctab_find(&t, 99), a);
    check(&t);
    ctab_free(&t); /* releases the live entries and their deliveries */
}

static void claim_table_heap_orders_by_deadline(void **state)
{
    (void)state;
    ctab t;
    assert_true(ctab_init(&t, 5000, NULL, NULL));
    enum { N = 3000 };
    for (uint64_t i = 0; i < N; i++) {
        /* many ties, negative and far-future times */
        int64_t due = (int64_t)(next_rand() % 500) - 100;
        if (i % 97 == 0) due = INT64_MAX - (int64_t)i;
        assert_int_not_equal(add(&t, i + 1, due), CTAB_NIL);
    }
    check(&t);
    int64_t last = INT64_MIN;
    for (uint32_t k = 0; k < N; k++) {
        int64_t due = pop(&t, NULL);
        assert_true(due >= last);
        last = due;
        if (k % 500 == 0) check(&t);
    }
    assert_int_equal(ctab_next(&t), CTAB_NIL);
    assert_int_equal(t.n_used, N); /* unscheduled, still in flight */
    check(&t);
    ctab_free(&t);
}

static uint32_t grow_calls, grow_last;
static bool grow_ok = true;
static bool on_grow(void *arg, uint32_t cap)
{
    assert_ptr_equal(arg, &grow_calls);
    grow_calls++;
    grow_last = cap;
    return grow_ok;
}

static void claim_table_grows_past_initial_capacity(void **state)
{
    (void)state;
    ctab t;
    grow_calls = 0;
    grow_ok = true;
    assert_true(ctab_init(&t, 1000, on_grow, &grow_calls));
    assert_int_equal(t.n_ents, 0);
    uint32_t idx[1000];
    for (uint32_t i = 0; i < 1000; i++) {
        idx[i] = add(&t, 1000 + i, 5000 - (int64_t)i);
        assert_int_not_equal(idx[i], CTAB_NIL);
        assert_true(t.n_ents >= t.n_used);
    }
    /* 64, 128, 256, 512, then the cap */
    assert_int_equal(grow_calls, 5);
    assert_int_equal(grow_last, 1000);
    assert_int_equal(t.n_ents, 1000);
    check(&t);
    /* the contents survived every move of the array */
    for (uint32_t i = 0; i < 1000; i++) {
        assert_int_equal(ctab_find(&t, 1000 + i), idx[i]);
        assert_int_equal(t.ents[idx[i]].due_ms, 5000 - (int64_t)i);
    }
    assert_int_equal(ctab_next(&t), idx[999]);
    ctab_free(&t);
}

static void claim_table_duplicate_keys(void **state)
{
    (void)state;
    ctab t;
    assert_true(ctab_init(&t, 100, NULL, NULL));
    uint32_t a = add(&t, 7, 10), b = add(&t, 7, 20);
    /* same bucket as 7 (the mask is at least 63) */
    uint32_t c = add(&t, 7 + (uint64_t)t.nb_mask + 1, 30);
    check(&t);
    assert_int_equal(ctab_find(&t, 7), b); /* the one hashed last */
    assert_int_equal(ctab_find(&t, 7 + (uint64_t)t.nb_mask + 1), c);
    ctab_release(&t, b);
    assert_int_equal(ctab_find(&t, 7), a);
    check(&t);
    ctab_release(&t, a);
    assert_int_equal(ctab_find(&t, 7), CTAB_NIL);
    assert_int_equal(ctab_find(&t, 7 + (uint64_t)t.nb_mask + 1), c);
    check(&t);
    ctab_free(&t);
}

static void claim_table_remove_from_middle(void **state)
{
    (void)state;
    ctab t;
    assert_true(ctab_init(&t, 1000, NULL, NULL));
    enum { N = 500 };
    uint32_t idx[N];
    for (uint32_t i = 0; i < N; i++) idx[i] = add(&t, i + 1, (int64_t)(next_rand() % 1000));
    /* Release entries at every heap position but the root, then unschedule some others: the
     * heap must stay ordered (an entry moved into a hole may have to go up or down). */
    for (uint32_t i = 0; i < N; i += 3) {
        if (t.ents[idx[i]].heap_pos == 0) continue;
        ctab_release(&t, idx[i]);
        check(&t);
    }
    for (uint32_t i = 1; i < N; i += 7) {
        if (t.ents[idx[i]].state == E_FREE) continue;
        ctab_unschedule(&t, idx[i]);
        assert_int_equal(t.ents[idx[i]].heap_pos, -1);
        assert_int_equal(ctab_find(&t, i + 1), idx[i]); /* still hashed, still in flight */
    }
    check(&t);
    int64_t last = INT64_MIN;
    while (ctab_next(&t) != CTAB_NIL) {
        int64_t due = pop(&t, NULL);
        assert_true(due >= last);
        last = due;
    }
    check(&t);
    ctab_free(&t);
}

static void claim_table_reschedule_reorders(void **state)
{
    (void)state;
    ctab t;
    assert_true(ctab_init(&t, 100, NULL, NULL));
    int64_t now = 1000000;
    uint32_t e[10];
    for (uint32_t i = 0; i < 10; i++) e[i] = add(&t, i + 1, now + 30000); /* ack_wait 30 s */
    for (uint32_t i = 0; i < 10; i++) ctab_schedule(&t, e[i], now + 30000 + i);
    assert_int_equal(ctab_next(&t), e[0]);
    /* NAK with backoff: due again in 5 s, ahead of the others */
    ctab_schedule(&t, e[7], now + 5000);
    assert_int_equal(ctab_next(&t), e[7]);
    check(&t);
    /* WPI (in progress): the deadline moves to a full ack_wait from now: last */
    ctab_schedule(&t, e[7], now + 60000);
    assert_int_equal(ctab_next(&t), e[0]);
    /* the head extended: the next one takes its place */
    ctab_schedule(&t, e[0], now + 45000);
    assert_int_equal(ctab_next(&t), e[1]);
    /* an immediate redelivery (NAK without delay) */
    ctab_schedule(&t, e[9], now);
    assert_int_equal(ctab_next(&t), e[9]);
    check(&t);
    assert_int_equal(t.heap_n, 10); /* rescheduling never duplicates an entry */
    uint32_t order[10], k = 0;
    while (ctab_next(&t) != CTAB_NIL) pop(&t, &order[k++]);
    assert_int_equal(k, 10);
    uint32_t want[10] = {e[9], e[1], e[2], e[3], e[4], e[5], e[6], e[8], e[0], e[7]};
    for (uint32_t i = 0; i < 10; i++) assert_int_equal(order[i], want[i]);
    ctab_free(&t);
}

static void claim_table_bounds(void **state)
{
    (void)state;
    ctab t;
    /* the cap: max_ack_pending entries, then CTAB_NIL until one is released */
    assert_true(ctab_init(&t, 100, NULL, NULL));
    for (uint64_t i = 0; i < 100; i++) assert_int_not_equal(add(&t, i + 1, 0), CTAB_NIL);
    assert_int_equal(ctab_alloc(&t), CTAB_NIL);
    assert_int_equal(ctab_alloc(&t), CTAB_NIL);
    assert_int_equal(t.n_ents, 100);
    assert_int_equal(t.n_used, 100);
    check(&t);
    ctab_release(&t, ctab_find(&t, 50));
    uint32_t idx = add(&t, 500, 0);
    assert_int_not_equal(idx, CTAB_NIL);
    assert_int_equal(ctab_alloc(&t), CTAB_NIL);
    check(&t);
    ctab_free(&t);

    /* out-of-range caps are clamped: below 1 to 1, above 2^24 to 2^24 */
    assert_true(ctab_init(&t, 0, NULL, NULL));
    assert_int_equal(t.max_ents, 1);
    assert_int_not_equal(add(&t, 1, 0), CTAB_NIL);
    assert_int_equal(ctab_alloc(&t), CTAB_NIL);
    ctab_free(&t);
    assert_true(ctab_init(&t, -5, NULL, NULL));
    assert_int_equal(t.max_ents, 1);
    ctab_free(&t);
    assert_true(ctab_init(&t, INT64_MAX, NULL, NULL));
    assert_int_equal(t.max_ents, CTAB_MAX_ENTRIES);
    assert_int_equal(t.nb_mask, (1u << 17) - 1); /* the bucket array stops at 2^17 */
    ctab_free(&t);

    /* a grow hook that refuses: no entry, the table as it was; later it may grow */
    grow_calls = 0;
    grow_ok = true;
    assert_true(ctab_init(&t, 1000, on_grow, &grow_calls));
    for (uint64_t i = 0; i < 64; i++) assert_int_not_equal(add(&t, i + 1, 0), CTAB_NIL);
    grow_ok = false;
    assert_int_equal(ctab_alloc(&t), CTAB_NIL);
    assert_int_equal(t.n_ents, 64);
    assert_int_equal(t.n_used, 64);
    check(&t);
    grow_ok = true;
    assert_int_not_equal(add(&t, 65, 0), CTAB_NIL);
    assert_int_equal(t.n_ents, 128);
    assert_int_equal(grow_last, 128);
    check(&t);
    ctab_free(&t);
}

static void claim_table_release_all_and_free(void **state)
{
    (void)state;
    ctab t;
    assert_true(ctab_init(&t, 300, NULL, NULL));
    for (uint64_t i = 0; i < 200; i++) add(&t, i + 1, (int64_t)i);
    uint32_t raw = ctab_alloc(&t); /* live, neither hashed nor scheduled */
    assert_int_not_equal(raw, CTAB_NIL);
    t.ents[raw].state = E_WAIT_SEND;
    ctab_release_all(&t);
    assert_int_equal(t.n_used, 0);
    assert_int_equal(t.heap_n, 0);
    assert_int_equal(ctab_next(&t), CTAB_NIL);
    assert_int_equal(ctab_find(&t, 5), CTAB_NIL);
    check(&t);
    for (uint64_t i = 0; i < 10; i++) add(&t, i + 1, 0);
    ctab_free(&t);
    assert_null(t.ents);
    ctab_free(&t); /* twice: harmless */
    /* a table that never held an entry */
    assert_true(ctab_init(&t, 10, NULL, NULL));
    ctab_free(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(claim_table_insert_find_remove),
        cmocka_unit_test(claim_table_heap_orders_by_deadline),
        cmocka_unit_test(claim_table_grows_past_initial_capacity),
        cmocka_unit_test(claim_table_duplicate_keys),
        cmocka_unit_test(claim_table_remove_from_middle),
        cmocka_unit_test(claim_table_reschedule_reorders),
        cmocka_unit_test(claim_table_bounds),
        cmocka_unit_test(claim_table_release_all_and_free),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
