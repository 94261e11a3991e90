/* pwatch.c -- the shared produce-offset watch of an MQ client. Contract: pwatch.h. */
#include "pwatch.h"

#include <pthread.h>
#include <stdio.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "fx_log.h"
#include "meta.h"

#define NBUCKETS 4096 /* power of two */

typedef struct reg {
    int64_t chan;
    fx_pwatch_fn fn;
    void *arg;
    struct reg *next;
} reg;

struct fx_pwatch {
    const fx_mq_keys *keys;
    fx_watch *w;
    pthread_mutex_t mu; /* buckets, n */
    reg *buckets[NBUCKETS];
    size_t n;
    fx_log_slot bad_log;
};

static size_t bucket_of(int64_t chan) { return (size_t)((uint64_t)chan * 0x9E3779B97F4A7C15ull >> 52) & (NBUCKETS - 1); }

static void on_update(void *arg, const fx_watch_update *u)
{
    fx_pwatch *w = arg;
    size_t n = u->kind == FX_WATCH_SNAPSHOT ? u->n_kvs : u->n_events;
    pthread_mutex_lock(&w->mu);
    for (size_t i = 0; i < n; i++) {
        const fx_kv *kv;
        if (u->kind == FX_WATCH_SNAPSHOT) {
            kv = &u->kvs[i];
        } else {
            if (u->events[i].type != FX_EV_PUT) continue;
            kv = &u->events[i].kv;
        }
        int64_t chan = -1, pidx = -1, off = -1;
        /* other control keys of the channels (members, consume offsets): not ours */
        if (fx_mq_parse_produce_offset_key(w->keys, (fx_slice){kv->key.data, kv->key.len}, &chan,
                                           &pidx))
            continue;
        if (fx_mq_produce_offset_decode(kv->value.data, kv->value.len, &off)) {
            fx_log_ratelimited(&w->bad_log, 5000, FX_LOG_WRN,
                               "produce-offset watch: ignoring a malformed offset of channel %lld",
                               (long long)chan);
            continue;
        }
        for (reg *r = w->buckets[bucket_of(chan)]; r; r = r->next)
            if (r->chan == chan) r->fn(r->arg, pidx, off);
    }
    pthread_mutex_unlock(&w->mu);
}

fx_err fx_pwatch_new(fx_etcd *etcd, const fx_mq_keys *keys, int timeout_ms, fx_pwatch **out)
{
    *out = NULL;
    fx_pwatch *w = calloc(1, sizeof *w);
    if (!w) return fx_seterr(FX_ENOMEM, "produce-offset watch: out of memory");
    w->keys = keys;
    pthread_mutex_init(&w->mu, NULL);
    char pre[FX_MQ_ROOT_MAX + 16];
    int pl = snprintf(pre, sizeof pre, "%s/channels/", keys->root);
    uint8_t end[sizeof pre];
    size_t el = fx_prefix_end((fx_slice){pre, (size_t)pl}, end);
    fx_watch_opts o = {.key = {pre, (size_t)pl}, .range_end = {end, el}, .fn = on_update, .arg = w};
    fx_err e = fx_watch_start(etcd, &o, timeout_ms, &w->w);
    if (e) {
        pthread_mutex_destroy(&w->mu);
        free(w);
        return e;
    }
    *out = w;
    return FX_OK;
}

fx_err fx_pwatch_add(fx_pwatch *w, int64_t chan, fx_pwatch_fn fn, void *arg)
{
    if (!w || !fn || chan < 0) return fx_seterr(FX_EINVAL, "produce-offset watch: bad arguments");
    reg *r = malloc(sizeof *r);
    if (!r) return fx_seterr(FX_ENOMEM, "produce-offset watch: out of memory");
    *r = (reg){.chan = chan, .fn = fn, .arg = arg};
    pthread_mutex_lock(&w->mu);
    if (w->n >= FX_PWATCH_MAX) {
        pthread_mutex_unlock(&w->mu);
        free(r);
        return fx_seterr(FX_EFULL, "produce-offset watch: %d consumers registered", FX_PWATCH_MAX);
    }
    size_t b = bucket_of(chan);
    r->next = w->buckets[b];
    w->buckets[b] = r;
    w->n++;
    pthread_mutex_unlock(&w->mu);
    return FX_OK;
}

void fx_pwatch_remove(fx_pwatch *w, void *arg)
{
    if (!w) return;
    pthread_mutex_lock(&w->mu);
    for (size_t b = 0; b < NBUCKETS && w->n; b++) {
        reg **pp = &w->buckets[b];
        while (*pp) {
            if ((*pp)->arg == arg) {
                reg *d = *pp;
                *pp = d->next;
                free(d);
                w->n--;
            } else {
                pp = &(*pp)->next;
            }
        }
    }
    pthread_mutex_unlock(&w->mu);
}

size_t fx_pwatch_count(fx_pwatch *w)
{
    if (!w) return 0;
    pthread_mutex_lock(&w->mu);
    size_t n = w->n;
    pthread_mutex_unlock(&w->mu);
    return n;
}

void fx_pwatch_free(fx_pwatch *w)
{
    if (!w) return;
    fx_watch_stop(w->w);
    for (size_t b = 0; b < NBUCKETS; b++) {
        reg *r = w->buckets[b];
        while (r) {
            reg *nx = r->next;
            free(r);
            r = nx;
        }
    }
    pthread_mutex_destroy(&w->mu);
    free(w);
}
