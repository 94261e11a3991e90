/* http.h -- the bridge's HTTP endpoint (libmicrohttpd): /healthz and /metrics.
 *
 *   GET /healthz  -> 200 {"status":"ok"}  or 503 {"status":"error","error":"<reason>"}
 *   GET /metrics  -> 200 Prometheus text (text/plain; version=0.0.4)
 *   anything else -> 404; methods other than GET/HEAD -> 405. Request bodies are refused.
 * Runs on libmicrohttpd's own thread with poll() (never select(), so it keeps answering when the
 * process holds more than 1,024 descriptors), plus a reaper thread. Bounds: 512 connections (128
 * per client address); a complete request head within 5 s of connecting or of the previous
 * answer (however slowly it trickles in), else the connection is closed; 10 s idle timeout; a
 * 32 KB request head (414/431 beyond it, or an immediate close when no room is left for the
 * answer). libmicrohttpd's messages are logged rate-limited.
 * Thread rules: start/stop from the main thread; `health` runs on the HTTP thread and must be
 * thread-safe and quick (read cached state; no blocking I/O).
 */
#ifndef FX_PLUGIN_HTTP_H
#define FX_PLUGIN_HTTP_H

#include <stddef.h>

#include "fx_err.h"
#include "metrics.h"

/* Health probe: return 0 if healthy; else -1 and write a short reason into err (no secrets). */
typedef int (*fx_health_fn)(void *arg, char *err, size_t errlen);

typedef struct fx_http fx_http;

/* listen: "host:port" (IPv4 or [IPv6]); port 0 picks a free one (see fx_http_port). */
fx_err fx_http_start(const char *listen, fx_health_fn health, void *health_arg,
                     fx_metrics *metrics, fx_http **out);
int fx_http_port(const fx_http *h);
void fx_http_stop(fx_http *h); /* NULL is a no-op; returns after the HTTP thread has stopped */

#endif
