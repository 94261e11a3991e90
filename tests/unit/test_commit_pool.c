/* Unit tests: the commit slots of MQ consumers on the executor (bridge/commit_pool): a failed
 * round backs off (50 ms doubling) and kicks do not shorten the backoff; a round with more to do
 * runs again at once; a kick while a round runs gives one more round; free drops a pending
 * retry. The round function is a fake (no etcd).
 *
 * Waits poll with a deadline stretched by the slow-build factor (FXT_MS); lower time bounds (a
 * backoff not cut short) are never stretched. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>

#include "commit_pool.h"
#include "executor.h"
#include "fx_time.h"
#include "tests/support/fxt_slow.h"

#define MAX_ROUNDS 16

typedef struct fake {
    fx_commit_res script[MAX_ROUNDS]; /* what round i returns (past the end: IDLE) */
    atomic_int rounds;
    _Atomic int64_t at_ms[MAX_ROUNDS];
    _Atomic int64_t retry_in[MAX_ROUNDS];
    /* round `block_at` waits until `go` is set */
    int block_at;
    atomic_int blocked, go;
} fake;

static fx_commit_res fake_round(void *arg, int64_t retry_in_ms)
{
    fake *f = arg;
    int i = atomic_fetch_add(&f->rounds, 1);
    if (i < MAX_ROUNDS) {
        atomic_store(&f->at_ms[i], fx_now_ms());
        atomic_store(&f->retry_in[i], retry_in_ms);
    }
    if (i == f->block_at) {
        atomic_store(&f->blocked, 1);
        int64_t dl = fx_now_ms() + FXT_MS(5000);
        while (!atomic_load(&f->go) && fx_now_ms() < dl) fx_sleep_ms(1);
    }
    return i < MAX_ROUNDS ? f->script[i] : FX_COMMIT_IDLE;
}

static fx_exec *new_exec(void)
{
    fx_exec_cfg cfg;
    fx_exec_cfg_defaults(&cfg);
    fx_exec *ex = NULL;
    assert_int_equal(fx_exec_new(&cfg, &ex), FX_OK);
    return ex;
}

/* Until f->rounds >= n and the commit kind is idle (5 s, stretched). */
static bool rounds_idle(fx_exec *ex, fake *f, int n)
{
    int64_t dl = fx_now_ms() + FXT_MS(5000);
    for (;;) {
        fx_exec_stats st;
        fx_exec_get_stats(ex, FX_EXEC_K_COMMIT, &st);
        if (atomic_load(&f->rounds) >= n && st.running == 0) return true;
        if (fx_now_ms() >= dl) return false;
        fx_sleep_ms(5);
    }
}

static void commit_pool_retry_backs_off_kicks_do_not_shorten(void **state)
{
    (void)state;
    fx_exec *ex = new_exec();
    fake f = {.script = {FX_COMMIT_RETRY, FX_COMMIT_RETRY, FX_COMMIT_IDLE}, .block_at = 0};
    fx_commit_slot *s = NULL;
    assert_int_equal(fx_commit_slot_new(ex, fake_round, &f, &s), FX_OK);
    fx_commit_slot_kick(s);
    /* Kicks while the failing round runs: its retry still waits the backoff after it. */
    int64_t dl = fx_now_ms() + FXT_MS(5000);
    while (!atomic_load(&f.blocked) && fx_now_ms() < dl) fx_sleep_ms(1);
    assert_int_equal(atomic_load(&f.blocked), 1);
    for (int i = 0; i < 5; i++) fx_commit_slot_kick(s);
    int64_t t_go = fx_now_ms();
    atomic_store(&f.go, 1);
    /* Acks keep coming during the backoffs: kicks must not bring the retries forward (kicks
     * stop once the second round began: one during the last, idle round would run it again). */
    while (atomic_load(&f.rounds) < 2 && fx_now_ms() < dl) {
        fx_commit_slot_kick(s);
        fx_sleep_ms(2);
    }
    assert_true(rounds_idle(ex, &f, 3));
    assert_int_equal(atomic_load(&f.rounds), 3);
    assert_int_equal(atomic_load(&f.retry_in[0]), FX_COMMIT_RETRY_MIN_MS);
    assert_int_equal(atomic_load(&f.retry_in[1]), 2 * FX_COMMIT_RETRY_MIN_MS);
    assert_true(atomic_load(&f.at_ms[1]) - t_go >= FX_COMMIT_RETRY_MIN_MS);
    assert_true(atomic_load(&f.at_ms[2]) - atomic_load(&f.at_ms[1]) >= 2 * FX_COMMIT_RETRY_MIN_MS);
    /* A success reset the backoff: the next failure waits the minimum again. */
    fx_commit_slot_kick(s);
    assert_true(rounds_idle(ex, &f, 4));
    assert_int_equal(atomic_load(&f.retry_in[3]), FX_COMMIT_RETRY_MIN_MS);
    fx_commit_slot_free(s);
    fx_exec_free(ex);
}

static void commit_pool_again_and_kick_while_running(void **state)
{
    (void)state;
    fx_exec *ex = new_exec();
    /* Round 0 blocks; kicks while it runs give exactly one more round; AGAIN runs again. */
    fake f = {.script = {FX_COMMIT_IDLE, FX_COMMIT_AGAIN, FX_COMMIT_AGAIN, FX_COMMIT_IDLE},
              .block_at = 0};
    fx_commit_slot *s = NULL;
    assert_int_equal(fx_commit_slot_new(ex, fake_round, &f, &s), FX_OK);
    fx_commit_slot_kick(s);
    int64_t dl = fx_now_ms() + FXT_MS(5000);
    while (!atomic_load(&f.blocked) && fx_now_ms() < dl) fx_sleep_ms(1);
    assert_int_equal(atomic_load(&f.blocked), 1);
    for (int i = 0; i < 5; i++) fx_commit_slot_kick(s);
    atomic_store(&f.go, 1);
    assert_true(rounds_idle(ex, &f, 4));
    assert_int_equal(atomic_load(&f.rounds), 4);
    fx_commit_slot_free(s);
    fx_exec_free(ex);
}

static void commit_pool_free_drops_pending_retry(void **state)
{
    (void)state;
    fx_exec *ex = new_exec();
    fake f = {.script = {FX_COMMIT_RETRY}, .block_at = -1};
    fx_commit_slot *s = NULL;
    assert_int_equal(fx_commit_slot_new(ex, fake_round, &f, &s), FX_OK);
    fx_commit_slot_kick(s);
    assert_true(rounds_idle(ex, &f, 1));
    fx_commit_slot_free(s); /* the retry 50 ms later must not run: s is gone */
    /* Watch for three backoffs: no second round (an absence: a fixed window, not stretched). */
    int64_t until = fx_now_ms() + 3 * FX_COMMIT_RETRY_MIN_MS;
    while (fx_now_ms() < until && atomic_load(&f.rounds) == 1) fx_sleep_ms(5);
    assert_int_equal(atomic_load(&f.rounds), 1);
    fx_exec_free(ex);
}

int main(int argc, char **argv)
{
    if (argc > 1) cmocka_set_test_filter(argv[1]); /* run only the tests matching argv[1] */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(commit_pool_retry_backs_off_kicks_do_not_shorten),
        cmocka_unit_test(commit_pool_again_and_kick_while_running),
        cmocka_unit_test(commit_pool_free_drops_pending_retry),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
