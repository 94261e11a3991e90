/* Unit tests: the error enum, its text table and the per-thread detail. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <string.h>

#include "fx_err.h"

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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_code_has_distinct_text_and_name),
        cmocka_unit_test(out_of_range_codes_are_safe),
        cmocka_unit_test(detail_is_per_thread_and_bounded),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
