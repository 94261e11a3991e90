/* Unit tests: the metrics registry and its Prometheus text rendering (plugin/metrics). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "metrics.h"
#include "tests/support/fxt_soft.h"

static void render_format_exact(void **state)
{
    (void)state;
    fx_metrics *m = fx_metrics_new(16);
    assert_non_null(m);
    fx_metric *cap_o = fx_metrics_add(m, "fluxon_captured_total", "Messages captured.",
                                      FX_METRIC_COUNTER, "orders");
    fx_metric *claims = fx_metrics_add(m, "fluxon_claims", "Claims held.", FX_METRIC_GAUGE, NULL);
    fx_metric *cap_p = fx_metrics_add(m, "fluxon_captured_total", "Messages captured.",
                                      FX_METRIC_COUNTER, "payments");
    fx_metric *backlog = fx_metrics_add(m, "fluxon_backlog", "Messages waiting.", FX_METRIC_GAUGE,
                                        "");
    assert_non_null(cap_o);
    assert_non_null(claims);
    assert_non_null(cap_p);
    assert_non_null(backlog);
    fx_metric_inc(cap_o, 3);
    fx_metric_inc(cap_o, 2);
    fx_metric_inc(cap_p, 1);
    fx_metric_set(claims, 2);
    fx_metric_set(backlog, -4);
    fx_metric_inc(NULL, 1); /* no-op */
    fx_metric_set(NULL, 1);
    char *txt = fx_metrics_render(m);
    assert_non_null(txt);
    assert_string_equal(txt,
                        "# HELP fluxon_captured_total Messages captured.\n"
                        "# TYPE fluxon_captured_total counter\n"
                        "fluxon_captured_total{channel=\"orders\"} 5\n"
                        "fluxon_captured_total{channel=\"payments\"} 1\n"
                        "# HELP fluxon_claims Claims held.\n"
                        "# TYPE fluxon_claims gauge\n"
                        "fluxon_claims 2\n"
                        "# HELP fluxon_backlog Messages waiting.\n"
                        "# TYPE fluxon_backlog gauge\n"
                        "fluxon_backlog -4\n");
    free(txt);
    fx_metrics_free(m);
}

static void label_and_help_escaping(void **state)
{
    (void)state;
    fx_metrics *m = fx_metrics_new(4);
    fx_metric *x = fx_metrics_add(m, "fluxon_dropped_total", "Dropped \\ messages\nsecond line",
                                  FX_METRIC_COUNTER, "a\\b\"c\nd");
    assert_non_null(x);
    fx_metric_inc(x, INT64_MAX);
    char *txt = fx_metrics_render(m);
    assert_string_equal(txt,
                        "# HELP fluxon_dropped_total Dropped \\\\ messages\\nsecond line\n"
                        "# TYPE fluxon_dropped_total counter\n"
                        "fluxon_dropped_total{channel=\"a\\\\b\\\"c\\nd\"} 9223372036854775807\n");
    free(txt);
    fx_metrics_free(m);
}

static void same_series_twice_and_limits(void **state)
{
    (void)state;
    fx_metrics *m = fx_metrics_new(3);
    fx_metric *a = fx_metrics_add(m, "fluxon_acked_total", "Acked.", FX_METRIC_COUNTER, "orders");
    fx_metric *b = fx_metrics_add(m, "fluxon_acked_total", "Acked.", FX_METRIC_COUNTER, "orders");
    assert_non_null(a);
    assert_ptr_equal(a, b);
    fx_metric_inc(a, 1);
    fx_metric_inc(b, 1);
    fx_metric *nolab = fx_metrics_add(m, "fluxon_acked_total", "Acked.", FX_METRIC_COUNTER, NULL);
    assert_ptr_equal(nolab, fx_metrics_add(m, "fluxon_acked_total", "Acked.", FX_METRIC_COUNTER, ""));
    assert_ptr_not_equal(nolab, a);
    /* The same name with another type is refused. */
    assert_null(fx_metrics_add(m, "fluxon_acked_total", "Acked.", FX_METRIC_GAUGE, "x"));
    /* Invalid names and over-long labels are refused. */
    assert_null(fx_metrics_add(m, "9bad", "", FX_METRIC_COUNTER, NULL));
    assert_null(fx_metrics_add(m, "bad-name", "", FX_METRIC_COUNTER, NULL));
    assert_null(fx_metrics_add(m, "", "", FX_METRIC_COUNTER, NULL));
    assert_null(fx_metrics_add(m, NULL, "", FX_METRIC_COUNTER, NULL));
    char longl[200];
    memset(longl, 'l', sizeof longl - 1);
    longl[sizeof longl - 1] = '\0';
    assert_null(fx_metrics_add(m, "fluxon_x", "", FX_METRIC_COUNTER, longl));
    longl[128] = '\0';
    assert_null(fx_metrics_add(m, "fluxon_x", "", FX_METRIC_COUNTER, longl));
    longl[127] = '\0';
    fx_metric *l127 = fx_metrics_add(m, "fluxon_x", "", FX_METRIC_COUNTER, longl);
    assert_non_null(l127); /* 127 bytes fit: third and last slot */
    assert_int_equal(strlen(l127->label), 127);
    /* Full: new series refused, existing ones still returned. */
    assert_null(fx_metrics_add(m, "fluxon_y", "", FX_METRIC_COUNTER, NULL));
    assert_ptr_equal(a, fx_metrics_add(m, "fluxon_acked_total", "Acked.", FX_METRIC_COUNTER,
                                        "orders"));
    char *txt = fx_metrics_render(m);
    assert_non_null(strstr(txt, "fluxon_acked_total{channel=\"orders\"} 2\n"));
    assert_non_null(strstr(txt, "fluxon_acked_total 0\n"));
    assert_non_null(strstr(txt, "# HELP fluxon_x \n# TYPE fluxon_x counter\n"));
    const char *h = strstr(txt, "# HELP fluxon_acked_total");
    assert_non_null(h);
    assert_null(strstr(h + 1, "# HELP fluxon_acked_total")); /* once per name */
    free(txt);
    fx_metrics_free(m);

    assert_null(fx_metrics_new(0));
    assert_null(fx_metrics_add(NULL, "a", "", FX_METRIC_COUNTER, NULL));
    fx_metrics_free(NULL);
    m = fx_metrics_new(2);
    txt = fx_metrics_render(m);
    assert_string_equal(txt, ""); /* empty registry */
    free(txt);
    fx_metrics_free(m);
}

typedef struct {
    fx_metric *x;
    int n;
} worker_arg;

static void *worker(void *p)
{
    worker_arg *w = p;
    for (int i = 0; i < w->n; i++) fx_metric_inc(w->x, 1);
    return NULL;
}

static void concurrent_updates_while_rendering(void **state)
{
    (void)state;
    fx_metrics *m = fx_metrics_new(4);
    fx_metric *x = fx_metrics_add(m, "fluxon_delivered_total", "Delivered.", FX_METRIC_COUNTER, "o");
    worker_arg w = {x, 100000};
    pthread_t t[4];
    int started = 0;
    while (started < 4 && pthread_create(&t[started], NULL, worker, &w) == 0) started++;
    fxt_soft soft = {0}; /* the workers use w and m: join them before a check leaves */
    for (int i = 0; i < 50; i++) {
        char *txt = fx_metrics_render(m);
        FXT_SOFT_CHECK(soft, txt != NULL);
        free(txt);
    }
    for (int i = 0; i < started; i++) pthread_join(t[i], NULL);
    assert_int_equal(started, 4);
    FXT_SOFT_END(soft);
    char *txt = fx_metrics_render(m);
    assert_non_null(strstr(txt, "fluxon_delivered_total{channel=\"o\"} 400000\n"));
    free(txt);
    fx_metrics_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(render_format_exact),
        cmocka_unit_test(label_and_help_escaping),
        cmocka_unit_test(same_series_twice_and_limits),
        cmocka_unit_test(concurrent_updates_while_rendering),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
