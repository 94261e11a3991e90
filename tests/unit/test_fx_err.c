/* Unit tests: the error enum, its text table, the per-thread detail, its hold and wrap. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdbool.h>
#include <string.h>

#include "fx_err.h"
#include "tests/support/fxt_soft.h"

static void every_code_has_distinct_text_and_name(void **state)
{
    (void)state;
    for (int i = 0; i < FX__COUNT; i++) {
        const char *t = fx_strerror((fx_err)i);
        const char *n = fx_errname((fx_err)i);
        assert_non_null(t);
        assert_non_null(n);
        assert_true(strlen(t) > 0);
        assert_true(strncmp(n, "FX_", 3) == 0);
        for (int j = 0; j < i; j++) {
            assert_string_not_equal(t, fx_strerror((fx_err)j));
            assert_string_not_equal(n, fx_errname((fx_err)j));
        }
    }
    assert_string_equal(fx_errname(FX_ETIMEDOUT), "FX_ETIMEDOUT");
    assert_string_equal(fx_strerror(FX_EKEY_BEING_WRITTEN), "key being written");
}

static void out_of_range_codes_are_safe(void **state)
{
    (void)state;
    assert_string_equal(fx_strerror((fx_err)FX__COUNT), "unknown error");
    assert_string_equal(fx_strerror((fx_err)-1), "unknown error");
    assert_string_equal(fx_errname((fx_err)12345), "FX_E?");
}

static void *other_thread(void *arg)
{
    (void)arg;
    fx_seterr(FX_EPROTO, "other thread %d", 7);
    return (void *)(intptr_t)(strcmp(fx_err_detail(), "other thread 7") == 0);
}

static void detail_is_per_thread_and_bounded(void **state)
{
    (void)state;
    fx_clearerr();
    assert_string_equal(fx_err_detail(), "");
    assert_int_equal(fx_seterr(FX_ETIMEDOUT, "put %s: %d ms", "k", 500), FX_ETIMEDOUT);
    assert_string_equal(fx_err_detail(), "put k: 500 ms");

    pthread_t t;
    void *ok = NULL;
    assert_int_equal(pthread_create(&t, NULL, other_thread, NULL), 0);
    assert_int_equal(pthread_join(t, &ok), 0);
    assert_true((intptr_t)ok);
    assert_string_equal(fx_err_detail(), "put k: 500 ms"); /* untouched by the other thread */

    char big[2000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    fx_seterr(FX_EINVAL, "%s", big);
    assert_int_equal(strlen(fx_err_detail()), 511);
    fx_clearerr();
    assert_string_equal(fx_err_detail(), "");
}

static void hold_keeps_detail_and_nests(void **state)
{
    (void)state;
    fx_seterr(FX_EUNAVAIL, "first failure");
    bool outer = fx_err_hold();
    assert_false(outer);
    /* while held: codes still come back, the text stays */
    assert_int_equal(fx_seterr(FX_ECLOSED, "cleanup failed"), FX_ECLOSED);
    assert_int_equal(fx_err_wrap(FX_EPROTO, "ctx: "), FX_EPROTO);
    fx_clearerr();
    assert_string_equal(fx_err_detail(), "first failure");
    bool inner = fx_err_hold(); /* a cleanup that holds on its own */
    assert_true(inner);
    fx_seterr(FX_EINVAL, "inner");
    fx_err_release(inner); /* still held by the outer hold */
    fx_seterr(FX_EINVAL, "after inner");
    assert_string_equal(fx_err_detail(), "first failure");
    fx_err_release(outer);
    /* released: back to normal */
    fx_seterr(FX_EINVAL, "second %d", 2);
    assert_string_equal(fx_err_detail(), "second 2");
    fx_clearerr();
    assert_string_equal(fx_err_detail(), "");
}

static void wrap_prefixes_and_truncates_safely(void **state)
{
    (void)state;
    fx_seterr(FX_ENOTFOUND, "lease not found");
    assert_int_equal(fx_err_wrap(FX_ELEASE_EXPIRED, "kv: put with lease %lld: ", 7LL),
                     FX_ELEASE_EXPIRED);
    assert_string_equal(fx_err_detail(), "kv: put with lease 7: lease not found");
    fx_err_wrap(FX_ELEASE_EXPIRED, "a: ");
    assert_string_equal(fx_err_detail(), "a: kv: put with lease 7: lease not found");
    /* on an empty detail: the context alone */
    fx_clearerr();
    fx_err_wrap(FX_EPROTO, "ctx");
    assert_string_equal(fx_err_detail(), "ctx");
    fx_err_wrap(FX_EPROTO, "%s", "");
    assert_string_equal(fx_err_detail(), "ctx");

    /* a long old text: cut at 511 bytes, context first, NUL-terminated */
    char big[600];
    memset(big, 'o', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    fx_seterr(FX_EINVAL, "%s", big);
    assert_int_equal(strlen(fx_err_detail()), 511);
    fx_err_wrap(FX_EINVAL, "ctx: ");
    const char *d = fx_err_detail();
    assert_int_equal(strlen(d), 511);
    assert_memory_equal(d, "ctx: ooo", 8);
    assert_int_equal(d[510], 'o');
    /* a context of exactly 510, 511 and more bytes */
    memset(big, 'c', sizeof big - 1);
    big[510] = '\0';
    fx_seterr(FX_EINVAL, "old");
    fx_err_wrap(FX_EINVAL, "%s", big);
    assert_int_equal(strlen(fx_err_detail()), 511);
    assert_int_equal(fx_err_detail()[510], 'o');
    big[510] = 'c';
    big[511] = '\0';
    fx_seterr(FX_EINVAL, "old");
    fx_err_wrap(FX_EINVAL, "%s", big);
    assert_int_equal(strlen(fx_err_detail()), 511);
    assert_null(strchr(fx_err_detail(), 'o'));
    big[511] = 'c';
    fx_seterr(FX_EINVAL, "old");
    fx_err_wrap(FX_EINVAL, "%s", big);
    assert_int_equal(strlen(fx_err_detail()), 511);
    assert_null(strchr(fx_err_detail(), 'o'));

    /* the arguments may be the detail itself (seterr and wrap format before they write) */
    fx_seterr(FX_EPROTO, "inner");
    fx_seterr(FX_EPROTO, "outer: %s", fx_err_detail());
    assert_string_equal(fx_err_detail(), "outer: inner");
    fx_err_wrap(FX_EPROTO, "[%s] ", fx_err_detail());
    assert_string_equal(fx_err_detail(), "[outer: inner] outer: inner");
    fx_clearerr();
}

/* Each thread its own hold and detail: a hold on one thread does not hold another. */
static pthread_barrier_t bar;
static void *hold_thread(void *arg)
{
    (void)arg;
    fx_seterr(FX_EPROTO, "worker");
    pthread_barrier_wait(&bar); /* main holds now */
    fx_seterr(FX_EPROTO, "worker 2");
    fx_err_wrap(FX_EPROTO, "w: ");
    bool ok = strcmp(fx_err_detail(), "w: worker 2") == 0;
    bool held = fx_err_hold();
    ok = ok && !held;
    pthread_barrier_wait(&bar); /* worker holds now */
    pthread_barrier_wait(&bar); /* main has set its detail */
    fx_seterr(FX_EPROTO, "ignored");
    ok = ok && strcmp(fx_err_detail(), "w: worker 2") == 0;
    fx_err_release(held);
    return (void *)(intptr_t)ok;
}

static void hold_and_detail_are_per_thread(void **state)
{
    (void)state;
    assert_int_equal(pthread_barrier_init(&bar, NULL, 2), 0);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, hold_thread, NULL), 0);
    fx_seterr(FX_EINVAL, "main");
    bool held = fx_err_hold();
    pthread_barrier_wait(&bar);
    pthread_barrier_wait(&bar);
    fx_err_release(held);
    fx_seterr(FX_EINVAL, "main 2"); /* not held here, though the worker holds */
    fxt_soft soft = {0};
    FXT_SOFT_CHECK(soft, strcmp(fx_err_detail(), "main 2") == 0); /* the worker is in the barrier */
    pthread_barrier_wait(&bar);
    void *ok = NULL;
    assert_int_equal(pthread_join(t, &ok), 0);
    FXT_SOFT_END(soft);
    assert_true((intptr_t)ok);
    assert_string_equal(fx_err_detail(), "main 2");
    pthread_barrier_destroy(&bar);
    fx_clearerr();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_code_has_distinct_text_and_name),
        cmocka_unit_test(out_of_range_codes_are_safe),
        cmocka_unit_test(detail_is_per_thread_and_bounded),
        cmocka_unit_test(hold_keeps_detail_and_nests),
        cmocka_unit_test(wrap_prefixes_and_truncates_safely),
        cmocka_unit_test(hold_and_detail_are_per_thread),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
