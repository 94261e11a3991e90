/* dmctx.c -- the daemon context's accessors (contract: dmctx.h). */
#include "dmctx.h"

#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "fx_time.h"

uint64_t dm_rand64(void)
{
    static _Thread_local uint64_t st;
    if (!st) {
        if (getrandom(&st, sizeof st, 0) != (ssize_t)sizeof st)
            st = (uint64_t)fx_wall_ns() ^ (uint64_t)(uintptr_t)&st;
        st |= 1;
    }
    st ^= st >> 12;
    st ^= st << 25;
    st ^= st >> 27;
    return st * 0x2545F4914F6CDD1DULL;
}

dm_chan *dm_find_chan_locked(fx_daemon *d, const char *name)
{
    for (size_t i = 0; i < d->n_chans; i++)
        if (strcmp(d->chans[i]->name, name) == 0) return d->chans[i];
    return NULL;
}

bool dm_nats_connected(fx_daemon *d)
{
    return d->nc && natsConnection_Status(d->nc) == NATS_CONN_STATUS_CONNECTED;
}

bool dm_wait_flag(fx_daemon *d, const bool *flag, int64_t ms)
{
    int64_t deadline = fx_now_ms() + (ms > 0 ? ms : 0);
    pthread_mutex_lock(&d->mu);
    while (!*flag && fx_ms_left(deadline) > 0) {
        struct timespec ts = fx_deadline_ts(deadline);
        pthread_cond_timedwait(&d->cv, &d->mu, &ts);
    }
    bool r = *flag;
    pthread_mutex_unlock(&d->mu);
    return r;
}

bool dm_bg_wait(fx_daemon *d, int64_t ms) { return dm_wait_flag(d, &d->stop_interest, ms); }

fx_config *dm_cfg_get(fx_daemon *d)
{
    pthread_mutex_lock(&d->cfg_mu);
    fx_config *c = fx_config_ref(d->cfg);
    pthread_mutex_unlock(&d->cfg_mu);
    return c;
}
