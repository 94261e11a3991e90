/* metrics.c -- a fixed registry of counters/gauges rendered as Prometheus text (see metrics.h).
 *
 * The series array is allocated once (max_series), so pointers stay valid. The mutex guards the
 * registry shape (registration, and the walk in render, so a SIGHUP-time registration cannot race
 * a scrape); values are atomics and never take it.
 * fx_metrics_new accepts 1..100000 series (else NULL).
 * fx_metrics_add returns NULL (and fx_metric_inc/set on NULL are no-ops) when the registry is
 * full, the name is not a Prometheus metric name, the label is longer than 127 bytes, or the
 * name is already registered with another kind.
 * Render: series grouped by name in first-registration order; per name "# HELP" and "# TYPE" once,
 * then `name{channel="x"} value` (label value escaped: \\ \" \n) or `name value`.
 */
#include "metrics.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct fx_metrics {
    pthread_mutex_t mu;
    size_t cap, n;
    fx_metric *series;
};

fx_metrics *fx_metrics_new(size_t max_series)
{
    if (max_series == 0 || max_series > 100000) return NULL;
    fx_metrics *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->series = calloc(max_series, sizeof *m->series);
    if (!m->series || pthread_mutex_init(&m->mu, NULL) != 0) {
        free(m->series);
        free(m);
        return NULL;
    }
    m->cap = max_series;
    return m;
}

void fx_metrics_free(fx_metrics *m)
{
    if (!m) return;
    pthread_mutex_destroy(&m->mu);
    free(m->series);
    free(m);
}

static bool name_valid(const char *s)
{
    if (!s || !*s) return false;
    for (size_t i = 0; s[i]; i++) {
        char c = s[i];
        bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
        if (!alpha && !(i > 0 && c >= '0' && c <= '9')) return false;
        if (i >= 200) return false;
    }
    return true;
}

fx_metric *fx_metrics_add(fx_metrics *m, const char *name, const char *help, fx_metric_kind k,
                          const char *channel_label)
{
    if (!m || !name_valid(name) || (k != FX_METRIC_COUNTER && k != FX_METRIC_GAUGE)) return NULL;
    if (!channel_label) channel_label = "";
    size_t ll = strnlen(channel_label, sizeof ((fx_metric *)0)->label);
    if (ll >= sizeof ((fx_metric *)0)->label) return NULL;
    fx_metric *r = NULL;
    pthread_mutex_lock(&m->mu);
    for (size_t i = 0; i < m->n; i++) {
        fx_metric *x = &m->series[i];
        if (strcmp(x->name, name) != 0) continue;
        if (x->kind != k) goto out; /* one name, one type */
        if (strcmp(x->label, channel_label) == 0) {
            r = x;
            goto out;
        }
    }
    if (m->n < m->cap) {
        r = &m->series[m->n];
        r->name = name;
        r->help = help ? help : "";
        r->kind = k;
        memcpy(r->label, channel_label, ll);
        r->label[ll] = '\0';
        atomic_store(&r->value, 0);
        m->n++;
    }
out:
    pthread_mutex_unlock(&m->mu);
    return r;
}

typedef struct sbuf {
    char *p;
    size_t n, cap;
    bool oom;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t l)
{
    if (b->oom) return;
    if (b->n + l + 1 > b->cap) {
        size_t nc = b->cap ? b->cap : 4096;
        while (nc < b->n + l + 1) nc *= 2;
        char *np = realloc(b->p, nc);
        if (!np) {
            b->oom = true;
            return;
        }
        b->p = np;
        b->cap = nc;
    }
    memcpy(b->p + b->n, s, l);
    b->n += l;
    b->p[b->n] = '\0';
}

static void sb_str(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

/* Escape \\ and \n (HELP), plus \" when quoted (label values). */
static void sb_escaped(sbuf *b, const char *s, bool quote)
{
    for (; *s; s++) {
        if (*s == '\\') sb_put(b, "\\\\", 2);
        else if (*s == '\n') sb_put(b, "\\n", 2);
        else if (quote && *s == '"') sb_put(b, "\\\"", 2);
        else sb_put(b, s, 1);
    }
}

char *fx_metrics_render(fx_metrics *m)
{
    sbuf b = {0};
    sb_put(&b, "", 0); /* an empty registry renders as "" */
    if (!m) return b.p;
    pthread_mutex_lock(&m->mu);
    for (size_t i = 0; i < m->n; i++) {
        const fx_metric *first = &m->series[i];
        bool seen = false;
        for (size_t j = 0; j < i && !seen; j++) seen = strcmp(m->series[j].name, first->name) == 0;
        if (seen) continue;
        sb_str(&b, "# HELP ");
        sb_str(&b, first->name);
        sb_str(&b, " ");
        sb_escaped(&b, first->help, false);
        sb_str(&b, "\n# TYPE ");
        sb_str(&b, first->name);
        sb_str(&b, first->kind == FX_METRIC_GAUGE ? " gauge\n" : " counter\n");
        for (size_t j = i; j < m->n; j++) {
            const fx_metric *x = &m->series[j];
            if (strcmp(x->name, first->name) != 0) continue;
            sb_str(&b, x->name);
            if (x->label[0]) {
                sb_str(&b, "{channel=\"");
                sb_escaped(&b, x->label, true);
                sb_str(&b, "\"}");
            }
            char num[32];
            int nl = snprintf(num, sizeof num, " %" PRId64 "\n", atomic_load(&x->value));
            sb_put(&b, num, (size_t)nl);
        }
    }
    pthread_mutex_unlock(&m->mu);
    if (b.oom) {
        free(b.p);
        return NULL;
    }
    return b.p;
}
