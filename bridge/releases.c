/* releases.c -- notice released claims at once: a watch on the ready keys of every MPMC under the
 * client's root. Contract: fluxon_mq.h (fx_mq_release_watch_*). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fx_log.h"
#include "mq_int.h"

struct fx_mq_release_watch {
    fx_watch *w;
    void (*fn)(void *arg, int64_t mpmc);
    void *arg;
    const fx_mq_keys *keys;
    char prefix[FX_MQ_KEY_CAP];
    uint8_t end[FX_MQ_KEY_CAP];
};

static void on_update(void *arg, const fx_watch_update *u)
{
    fx_mq_release_watch *rw = arg;
    if (u->kind != FX_WATCH_EVENTS) return;
    for (size_t i = 0; i < u->n_events; i++) {
        const fx_event *ev = &u->events[i];
        int64_t mpmc = -1, chan = -1;
        if (ev->type == FX_EV_DELETE &&
            fx_mq_parse_ready_key(rw->keys, (fx_slice){ev->kv.key.data, ev->kv.key.len}, &mpmc,
                                  &chan) == FX_OK)
            rw->fn(rw->arg, mpmc);
    }
}

fx_err fx_mq_release_watch_start(fx_mq_client *c, void (*fn)(void *arg, int64_t mpmc), void *arg,
                                 int timeout_ms, fx_mq_release_watch **out)
{
    if (!c || !fn || !out) return fx_seterr(FX_EINVAL, "release watch: NULL argument");
    fx_mq_release_watch *rw = calloc(1, sizeof *rw);
    if (!rw) return fx_seterr(FX_ENOMEM, "release watch: out of memory");
    rw->fn = fn;
    rw->arg = arg;
    rw->keys = &c->keys;
    int n = snprintf(rw->prefix, sizeof rw->prefix, "%s/mpmc_channels/ready/", c->keys.root);
    if (n < 0 || (size_t)n >= sizeof rw->prefix) {
        free(rw);
        return fx_seterr(FX_EINVAL, "release watch: root too long");
    }
    fx_slice end = {rw->end, fx_prefix_end(FX_SLICE_STR(rw->prefix), rw->end)};
    fx_err e = fx__mq_op_enter(c);
    if (e) {
        free(rw);
        return e;
    }
    fx_watch_opts o = {.key = FX_SLICE_STR(rw->prefix), .range_end = end, .fn = on_update,
                       .arg = rw};
    e = fx_watch_start(c->etcd, &o, timeout_ms, &rw->w);
    fx__mq_op_leave(c);
    if (e) {
        free(rw);
        return e;
    }
    *out = rw;
    return FX_OK;
}

void fx_mq_release_watch_stop(fx_mq_release_watch *rw)
{
    if (!rw) return;
    fx_watch_stop(rw->w);
    free(rw);
}
