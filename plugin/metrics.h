/* metrics.h -- counters and gauges with Prometheus text rendering.
 *
 * A fixed registry of named series, optionally with one label (channel). Values are atomics:
 * any thread may update them. Registration happens at start-up (not thread-safe against
 * rendering); rendering may run concurrently with updates.
 */
#ifndef FX_PLUGIN_METRICS_H
#define FX_PLUGIN_METRICS_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

typedef enum { FX_METRIC_COUNTER = 0, FX_METRIC_GAUGE = 1 } fx_metric_kind;

typedef struct fx_metric {
    const char *name;   /* e.g. "fluxon_captured_total" (static string) */
    const char *help;   /* static string */
    fx_metric_kind kind;
    char label[128];    /* channel name or "" */
    _Atomic int64_t value;
} fx_metric;

typedef struct fx_metrics fx_metrics;

fx_metrics *fx_metrics_new(size_t max_series);
void fx_metrics_free(fx_metrics *m);
/* Register a series (name, help static); returns a pointer valid until fx_metrics_free, or NULL
 * when the registry is full. Registering the same (name, label) twice returns the same series. */
fx_metric *fx_metrics_add(fx_metrics *m, const char *name, const char *help, fx_metric_kind k,
                          const char *channel_label);
static inline void fx_metric_inc(fx_metric *x, int64_t d) { if (x) atomic_fetch_add(&x->value, d); }
static inline void fx_metric_set(fx_metric *x, int64_t v) { if (x) atomic_store(&x->value, v); }
/* Render all series in Prometheus text format (HELP/TYPE once per name, label channel="..."
 * escaped). Returns a malloc'd string (caller frees) or NULL on OOM. */
char *fx_metrics_render(fx_metrics *m);

#endif
