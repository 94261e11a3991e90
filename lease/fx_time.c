#include "fx_time.h"

#include <errno.h>

int64_t fx_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t fx_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

int64_t fx_wall_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int64_t fx_ms_left(int64_t deadline_ms)
{
    int64_t left = deadline_ms - fx_now_ms();
    return left > 0 ? left : 0;
}

struct timespec fx_deadline_ts(int64_t deadline_ms)
{
    struct timespec ts;
    ts.tv_sec = (time_t)(deadline_ms / 1000);
    ts.tv_nsec = (long)((deadline_ms % 1000) * 1000000);
    return ts;
}

void fx_sleep_ms(int64_t ms)
{
    struct timespec ts = {(time_t)(ms / 1000), (long)((ms % 1000) * 1000000)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

int fx_cond_init_monotonic(pthread_cond_t *c)
{
    pthread_condattr_t a;
    int rc = pthread_condattr_init(&a);
    if (rc) return rc;
    rc = pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    if (!rc) rc = pthread_cond_init(c, &a);
    pthread_condattr_destroy(&a);
    return rc;
}
