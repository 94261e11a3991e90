/* fx_log.h -- logging in the NATS style: "[pid] 2026/11/30 11:41:58.123456 [INF] text".
 *
 * Contract:
 *  - Lines go to stderr (one write(2) per line, so lines from threads never interleave).
 *  - Levels: FX_LOG_DBG < FX_LOG_INF < FX_LOG_WRN < FX_LOG_ERR; lines below the current level
 *    are dropped. The level starts at INF, or from env FX_LOG_LEVEL (debug|info|warn|error).
 *  - Callers never pass credentials to the log.
 *  - fx_log_ratelimited() drops a line when the same `slot` logged less than `interval_ms` ago
 *    and counts the drops; the next line printed for that slot says how many were suppressed.
 * Thread rules: all functions are thread-safe.
 */
#ifndef FX_LOG_H
#define FX_LOG_H

#include <stdint.h>

typedef enum { FX_LOG_DBG = 0, FX_LOG_INF, FX_LOG_WRN, FX_LOG_ERR } fx_log_level;

void fx_log_set_level(fx_log_level lvl);
fx_log_level fx_log_get_level(void);
void fx_log(fx_log_level lvl, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* A rate-limit slot; zero-initialise (static or in a struct). */
typedef struct {
    _Atomic int64_t last_ms;
    _Atomic uint64_t suppressed;
} fx_log_slot;

void fx_log_ratelimited(fx_log_slot *slot, int64_t interval_ms, fx_log_level lvl,
                        const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/* Name the calling thread (top -H, perf, /proc/<pid>/task/<tid>/comm): "fx-" roles, cut to the
 * kernel's 15 characters. Every thread this project starts calls it first; cnats's, libcurl's and
 * libmicrohttpd's threads keep their library's name. */
void fx_thread_name(const char *name);

#define FX_DBG(...) fx_log(FX_LOG_DBG, __VA_ARGS__)
#define FX_INF(...) fx_log(FX_LOG_INF, __VA_ARGS__)
#define FX_WRN(...) fx_log(FX_LOG_WRN, __VA_ARGS__)
#define FX_ERR(...) fx_log(FX_LOG_ERR, __VA_ARGS__)

#endif
