#include "fx_log.h"
#include "fx_time.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static _Atomic int fx_level = -1;

static const char *const fx_lvl_tag[] = {"DBG", "INF", "WRN", "ERR"};

static int level_from_env(void)
{
    const char *s = getenv("FX_LOG_LEVEL");
    if (!s) return FX_LOG_INF;
    if (!strcmp(s, "debug")) return FX_LOG_DBG;
    if (!strcmp(s, "warn")) return FX_LOG_WRN;
    if (!strcmp(s, "error")) return FX_LOG_ERR;
    return FX_LOG_INF;
}

fx_log_level fx_log_get_level(void)
{
    int l = atomic_load(&fx_level);
    if (l < 0) {
        l = level_from_env();
        atomic_store(&fx_level, l);
    }
    return (fx_log_level)l;
}

void fx_log_set_level(fx_log_level lvl) { atomic_store(&fx_level, (int)lvl); }

static void vlog(fx_log_level lvl, const char *prefix, const char *fmt, va_list ap)
{
    char line[2048];
    struct timeval tv;
    struct tm tm;
    gettimeofday(&tv, NULL);
    localtime_r(&tv.tv_sec, &tm);
    int n = snprintf(line, sizeof line, "[%d] %04d/%02d/%02d %02d:%02d:%02d.%06ld [%s] %s",
                     (int)getpid(), tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
                     tm.tm_min, tm.tm_sec, (long)tv.tv_usec, fx_lvl_tag[lvl], prefix);
    if (n < 0) return;
    if ((size_t)n < sizeof line - 1) {
        int m = vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
        if (m > 0) n += m;
    }
    if ((size_t)n > sizeof line - 2) n = (int)sizeof line - 2;
    line[n++] = '\n';
    ssize_t w = write(2, line, (size_t)n);
    (void)w;
}

void fx_log(fx_log_level lvl, const char *fmt, ...)
{
    if (lvl < fx_log_get_level()) return;
    va_list ap;
    va_start(ap, fmt);
    vlog(lvl, "", fmt, ap);
    va_end(ap);
}

void fx_log_ratelimited(fx_log_slot *slot, int64_t interval_ms, fx_log_level lvl,
                        const char *fmt, ...)
{
    if (lvl < fx_log_get_level()) return;
    int64_t now = fx_now_ms();
    int64_t last = atomic_load(&slot->last_ms);
    if (last != 0 && now - last < interval_ms) {
        atomic_fetch_add(&slot->suppressed, 1);
        return;
    }
    if (!atomic_compare_exchange_strong(&slot->last_ms, &last, now)) {
        atomic_fetch_add(&slot->suppressed, 1);
        return;
    }
    uint64_t sup = atomic_exchange(&slot->suppressed, 0);
    char prefix[64] = "";
    if (sup) snprintf(prefix, sizeof prefix, "(%llu similar suppressed) ", (unsigned long long)sup);
    va_list ap;
    va_start(ap, fmt);
    vlog(lvl, prefix, fmt, ap);
    va_end(ap);
}

void fx_thread_name(const char *name)
{
    char buf[16]; /* the kernel's TASK_COMM_LEN, NUL included */
    snprintf(buf, sizeof buf, "%s", name ? name : "fx");
    (void)pthread_setname_np(pthread_self(), buf);
}
