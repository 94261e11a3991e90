/* mq_bench.c -- Fluxon MQ (bridge/) throughput: MPMC put -> get -> ack on a real etcd.
 *
 *   mq_bench [-d seconds] [-s size] [-T grpc|json]
 *
 * Starts its own etcd (tests/support/fxt) or uses $FX_ETCD_ENDPOINT. For each row it creates a
 * fresh MPMC channel, runs P producer threads putting batches of B values for `seconds`, and C
 * consumer threads that get and ack everything; then it drains (until every stored message was
 * consumed) and prints one markdown row: messages/s end to end (acked / time until drained),
 * put-batch latency p50/p99, and the etcd requests per message.
 * Rows compare batch sizes, the two payload layouts and the two payload planes side by side in
 * the same run:
 *   payload "segment": one KV value per batch; "key per msg": one key per message (reference);
 *   plane shared: payloads share the control-plane client (a batch = one txn with its offset
 *   advance); split: payloads go through their own client (payload put + offset txn: two raft
 *   commits).
 * -T: the etcd client's transport for KV calls (lease/etcd.h): "json" (default: the JSON gateway)
 * or "grpc" (etcd's gRPC API); printed above the table.
 * Exit 1 on any lost message (acked != stored) or error.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fluxon_mq.h"
#include "tests/support/fxt.h"

#define MAX_THREADS 16
#define MAX_BATCH 1024 /* rows[].batch must not exceed it (checked in main) */
#define LAT_MAX 200000

typedef struct row {
    const char *layout;
    bool per_key; /* payloads one key per message (the reference layout), else one segment/batch */
    int producers, consumers, batch;
} row;

typedef struct run {
    fx_mq_client *c;
    int64_t mpmc;
    int batch;
    size_t size;
    int64_t stop_ms;
    atomic_llong stored, acked, errors;
    atomic_bool producers_done;
    pthread_mutex_t mu;
    int64_t *lat_us;
    size_t n_lat;
} run;

static void *producer_main(void *arg)
{
    run *r = arg;
    fx_mpmc_producer *p = NULL;
    fx_err oe = fx_mpmc_producer_open(r->c, r->mpmc, 0, &p);
    if (oe != FX_OK) {
        fprintf(stderr, "producer open: %s (%s)\n", fx_strerror(oe), fx_err_detail());
        atomic_fetch_add(&r->errors, 1);
        return NULL;
    }
    char *buf = malloc(r->size);
    memset(buf, 'x', r->size);
    fx_slice vals[MAX_BATCH];
    for (int i = 0; i < r->batch; i++) vals[i] = (fx_slice){buf, r->size};
    while (fxt_now_ms() < r->stop_ms) {
        size_t n_put = 0;
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        fx_err e = fx_mpmc_put(p, vals, (size_t)r->batch, 5000, &n_put, NULL);
        clock_gettime(CLOCK_MONOTONIC, &b);
        int64_t us = (b.tv_sec - a.tv_sec) * 1000000 + (b.tv_nsec - a.tv_nsec) / 1000;
        atomic_fetch_add(&r->stored, (long long)n_put);
        if (e != FX_OK && e != FX_EFULL) {
            atomic_fetch_add(&r->errors, 1);
            fprintf(stderr, "put: %s (%s)\n", fx_strerror(e), fx_err_detail());
        }
        pthread_mutex_lock(&r->mu);
        if (r->n_lat < LAT_MAX) r->lat_us[r->n_lat++] = us;
        pthread_mutex_unlock(&r->mu);
    }
    free(buf);
    fx_mpmc_producer_free(p);
    return NULL;
}

typedef struct cons_arg {
    run *r;
    fx_mpmc_consumer *c;
} cons_arg;

static void *consumer_main(void *arg)
{
    cons_arg *ca = arg;
    run *r = ca->r;
    fx_mq_delivery d[256];
    fx_mq_msg_id ids[256];
    int64_t idle_since = 0;
    for (;;) {
        size_t n = 0;
        fx_err e = fx_mpmc_get(ca->c, d, 256, &n, 200);
        if (e == FX_OK && n > 0) {
            for (size_t i = 0; i < n; i++) {
                ids[i] = d[i].id;
                fx_mq_delivery_free(&d[i]);
            }
            if (fx_mpmc_ack(ca->c, ids, n) != FX_OK) atomic_fetch_add(&r->errors, 1);
            atomic_fetch_add(&r->acked, (long long)n);
            idle_since = 0;
            continue;
        }
        if (e != FX_ETIMEDOUT) {
            atomic_fetch_add(&r->errors, 1);
            fprintf(stderr, "get: %s (%s)\n", fx_strerror(e), fx_err_detail());
            break;
        }
        /* Drained: producers finished and nothing came for a while (bounded). */
        if (atomic_load(&r->producers_done)) {
            if (!idle_since) idle_since = fxt_now_ms();
            if (atomic_load(&r->acked) >= atomic_load(&r->stored) ||
                fxt_now_ms() - idle_since > 5000)
                break;
        }
    }
    fx_mpmc_flush(ca->c, 5000);
    return NULL;
}

static bool g_grpc; /* -T grpc */

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

static int run_row(const char *endpoint, const row *w, int seconds, size_t size, int idx)
{
    const char *eps[] = {endpoint};
    fx_mq_client_opts o = {.etcd = {.endpoints = eps, .n_endpoints = 1, .grpc = g_grpc}, .min_ttl_s = 2,
                           .per_message_keys = w->per_key};
    char root[64];
    snprintf(root, sizeof root, "/bench%d", idx);
    o.root = root;
    if (!strcmp(w->layout, "split")) {
        o.kv_endpoints = eps;
        o.n_kv_endpoints = 1;
    }
    run r = {.batch = w->batch, .size = size};
    pthread_mutex_init(&r.mu, NULL);
    r.lat_us = malloc(sizeof(int64_t) * LAT_MAX);
    if (fx_mq_client_new(&o, &r.c) != FX_OK) return -1;
    fx_mq_chan_cfg cfg = {.capacity = 1000000, .ttl_s = 10};
    if (fx_mpmc_resolve(r.c, "bench", &cfg, &r.mpmc) != FX_OK) {
        fprintf(stderr, "resolve: %s\n", fx_err_detail());
        return -1;
    }
    /* Consumers first, so every sub-MPSC is claimed before producers route. */
    cons_arg ca[MAX_THREADS];
    for (int i = 0; i < w->consumers; i++) {
        ca[i].r = &r;
        fx_err e = fx_mpmc_consumer_open(r.c, r.mpmc, &ca[i].c);
        if (e != FX_OK) {
            fprintf(stderr, "consumer open: %s (%s)\n", fx_strerror(e), fx_err_detail());
            return -1;
        }
    }
    fx_etcd_stats s0;
    fx_etcd_get_stats(fx_mq_client_etcd(r.c), &s0);
    int64_t t0 = fxt_now_ms();
    r.stop_ms = t0 + seconds * 1000;
    pthread_t pt[MAX_THREADS], ct[MAX_THREADS];
    for (int i = 0; i < w->consumers; i++) pthread_create(&ct[i], NULL, consumer_main, &ca[i]);
    for (int i = 0; i < w->producers; i++) pthread_create(&pt[i], NULL, producer_main, &r);
    for (int i = 0; i < w->producers; i++) pthread_join(pt[i], NULL);
    atomic_store(&r.producers_done, true);
    for (int i = 0; i < w->consumers; i++) pthread_join(ct[i], NULL);
    int64_t t1 = fxt_now_ms();
    fx_etcd_stats s1;
    fx_etcd_get_stats(fx_mq_client_etcd(r.c), &s1);
    uint64_t reqs = s1.requests - s0.requests;
    if (!strcmp(w->layout, "split")) {
        fx_etcd_stats k;
        fx_etcd_get_stats(fx_kv_etcd(fx_mq_client_kv(r.c)), &k);
        reqs += k.requests;
    }
    for (int i = 0; i < w->consumers; i++) fx_mpmc_consumer_free(ca[i].c);
    fx_mq_client_free(r.c);

    qsort(r.lat_us, r.n_lat, sizeof(int64_t), cmp_i64);
    double p50 = r.n_lat ? (double)r.lat_us[r.n_lat / 2] / 1000.0 : 0;
    double p99 = r.n_lat ? (double)r.lat_us[(r.n_lat * 99) / 100] / 1000.0 : 0;
    long long stored = atomic_load(&r.stored), acked = atomic_load(&r.acked);
    double secs = (double)(t1 - t0) / 1000.0;
    printf("| %s | %s | %d | %d | %d | %zu B | %lld | %lld | %.0f | %.2f / %.2f | %.2f |\n",
           w->layout, w->per_key ? "key per msg" : "segment", w->producers, w->consumers, w->batch, size, stored, acked, (double)acked / secs, p50, p99,
           acked ? (double)reqs / (double)acked : 0.0);
    fflush(stdout);
    free(r.lat_us);
    long long errs = atomic_load(&r.errors);
    if (acked != stored || errs) {
        fprintf(stderr, "row %d: stored %lld acked %lld errors %lld\n", idx, stored, acked, errs);
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    int seconds = 5, opt;
    size_t size = 128;
    while ((opt = getopt(argc, argv, "d:s:T:")) != -1) {
        if (opt == 'd') {
            long v = strtol(optarg, NULL, 10);
            seconds = v > 0 && v < 3600 ? (int)v : 5;
        }
        else if (opt == 's') size = (size_t)strtoul(optarg, NULL, 10);
        else if (opt == 'T' && (!strcmp(optarg, "grpc") || !strcmp(optarg, "json")))
            g_grpc = !strcmp(optarg, "grpc");
        else {
            fprintf(stderr, "usage: %s [-d seconds] [-s size] [-T grpc|json]\n", argv[0]);
            return 2;
        }
    }
    if (size == 0 || size > 65536) size = 128;
    fxt_etcd etcd = {0};
    const char *ep = getenv("FX_ETCD_ENDPOINT");
    if (!ep || !*ep) {
        if (fxt_etcd_start(&etcd) != 0) return 1;
        ep = etcd.endpoint;
    }
    static const row rows[] = {
        {"shared", true, 1, 1, 1},    {"shared", false, 1, 1, 1},
        {"shared", true, 1, 1, 100},  {"shared", false, 1, 1, 100},
        {"shared", true, 4, 2, 100},  {"shared", false, 4, 2, 100},
        {"split", false, 4, 2, 100},  {"shared", false, 4, 2, 1000},
    };
    printf("etcd transport of KV calls: %s\n\n", g_grpc ? "gRPC" : "JSON gateway");
    printf("| plane | payload | producers | consumers | batch | size | stored | acked | msgs/s | put p50/p99 ms | etcd req/msg |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
    int rc = 0;
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        if (rows[i].batch < 1 || rows[i].batch > MAX_BATCH || rows[i].producers > MAX_THREADS ||
            rows[i].consumers > MAX_THREADS) {
            fprintf(stderr, "row %zu: batch or thread count out of range\n", i);
            return 2;
        }
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        if (run_row(ep, &rows[i], seconds, size, (int)i) != 0) rc = 1;
    fxt_etcd_destroy(&etcd);
    return rc;
}
