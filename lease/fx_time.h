/* fx_time.h -- monotonic time and deadlines (milliseconds).
 * Wall-clock jumps never move a deadline or a lease cadence: everything uses CLOCK_MONOTONIC.
 * Thread rules: all functions are thread-safe. */
#ifndef FX_TIME_H
#define FX_TIME_H

#include <stdint.h>
#include <time.h>

/* Monotonic milliseconds since an arbitrary origin. */
int64_t fx_now_ms(void);
/* Monotonic microseconds since an arbitrary origin. */
int64_t fx_now_us(void);
/* Wall-clock nanoseconds since the Unix epoch (for timestamps in messages only). */
int64_t fx_wall_ns(void);
/* Milliseconds left until deadline_ms (a fx_now_ms() value); 0 if passed. */
int64_t fx_ms_left(int64_t deadline_ms);
/* A CLOCK_MONOTONIC timespec for deadline_ms, for pthread_cond_timedwait on a condvar whose
 * clock was set with fx_cond_init_monotonic(). */
struct timespec fx_deadline_ts(int64_t deadline_ms);
/* Sleep for ms milliseconds (EINTR-safe). Test and retry-backoff use only, never for sync. */
void fx_sleep_ms(int64_t ms);

#include <pthread.h>
/* Initialise a condvar that waits on CLOCK_MONOTONIC. */
int fx_cond_init_monotonic(pthread_cond_t *c);

#endif
