/* payload_bench.c -- the physical limit of the MQ's payload path on etcd, without MQ code.
 *
 *   payload_bench [-d seconds]
 *
 * Each worker thread repeats the etcd work the MQ does for one batch of B messages of S bytes:
 *   1. one txn: the payload write (B keys, or ONE segment value of B messages back to back) plus
 *      the produce-offset put;
 *   2. one range read of the batch (the consumer's fetch);
 *   3. one delete_range of the batch (the commit's payload delete).
 * Rows: per-message keys vs one segment per batch, 128 B and 4 KiB, 1 and 4 threads; one etcd
 * started on free loopback ports (tests/support/fxt; defaults, fsync on), compacted between
 * rows. Prints one markdown table: messages/s and MB/s of payload through the whole cycle.
 * Exit 1 on any failed call or a short read. SIGINT/SIGTERM end the current row; etcd is torn
 * down at exit (PR_SET_PDEATHSIG covers a crash).
 */
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "etcd.h"
#include "tests/support/fxt.h"

#define MAX_T 8
#define MAX_B 256
#define CALL_MS 10000

static atomic_bool g_stop, g_row_stop;
static fx_etcd *g_c;

typedef struct cfg {
    int threads, batch;
    size_t size;
    bool segment;
} cfg;

typedef struct wk {
    const cfg *cf;
    long id;
    long long msgs;
    bool failed;
} wk;

static void on_signal(int s)
{
    (void)s;
    atomic_store(&g_stop, true);
    atomic_store(&g_row_stop, true);
}

static void *worker(void *arg)
{
    wk *w = arg;
    const cfg *cf = w->cf;
    size_t vlen = cf->segment ? (size_t)cf->batch * (cf->size + 4) + 8 : cf->size;
    char *val = malloc(vlen);
    if (!val) {
        w->failed = true;
        return NULL;
    }
    memset(val, 'x', vlen);
    char keys[MAX_B + 1][64], off[32], s0[64], s1[64];
    fx_op ops[MAX_B + 1];
    long long id = 0;
    while (!atomic_load(&g_row_stop)) {
        int n = 0, nk = cf->segment ? 1 : cf->batch;
        for (int i = 0; i < nk; i++) {
            snprintf(keys[i], sizeof keys[i], "/pb/%ld/%020lld", w->id,
                     cf->segment ? id + cf->batch - 1 : id + i);
            ops[n++] = (fx_op){.type = FX_OP_PUT,
                               .u.put = {.key = FX_SLICE_STR(keys[i]), .value = {val, vlen}}};
        }
        snprintf(keys[MAX_B], sizeof keys[MAX_B], "/po/%ld", w->id);
        snprintf(off, sizeof off, "%lld", id + cf->batch - 1);
        ops[n++] = (fx_op){.type = FX_OP_PUT,
                           .u.put = {.key = FX_SLICE_STR(keys[MAX_B]), .value = FX_SLICE_STR(off)}};
        fx_txn_req tx = {.success = ops, .n_success = (size_t)n};
        snprintf(s0, sizeof s0, "/pb/%ld/%020lld", w->id, id);
        snprintf(s1, sizeof s1, "/pb/%ld/%020lld", w->id, id + cf->batch);
        fx_range_req rr = {.key = FX_SLICE_STR(s0), .range_end = FX_SLICE_STR(s1)};
        fx_range_resp rs = {0};
        fx_del_req dr = {.key = FX_SLICE_STR(s0), .range_end = FX_SLICE_STR(s1)};
        fx_err e = fx_etcd_txn(g_c, &tx, NULL, CALL_MS);
        if (!e) e = fx_etcd_range(g_c, &rr, &rs, CALL_MS);
        bool short_read = !e && rs.n_kvs != (size_t)nk;
        fx_range_resp_free(&rs);
        if (!e && !short_read) e = fx_etcd_delete(g_c, &dr, NULL, CALL_MS);
        if (e || short_read) {
            fprintf(stderr, "payload_bench: %s\n", short_read ? "short read" : fx_err_detail());
            w->failed = true;
            break;
        }
        id += cf->batch;
        w->msgs += cf->batch;
    }
    free(val);
    return NULL;
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static void compact(void)
{
    fx_etcd_status st;
    if (fx_etcd_status_get(g_c, &st, CALL_MS) == FX_OK && st.revision > 1)
        fx_etcd_compact(g_c, st.revision, 30000);
}

int main(int argc, char **argv)
{
    int dur = 4, opt;
    while ((opt = getopt(argc, argv, "d:")) != -1) {
        if (opt == 'd' && atoi(optarg) > 0 && atoi(optarg) <= 600) {
            dur = atoi(optarg);
        } else {
            fprintf(stderr, "usage: %s [-d seconds (1..600)]\n", argv[0]);
            return 2;
        }
    }
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    fxt_etcd etcd = {0};
    if (fxt_etcd_start(&etcd) != 0) return 1;
    const char *ep = etcd.endpoint;
    fx_etcd_opts o = {.endpoints = &ep, .n_endpoints = 1};
    if (fx_etcd_new(&o, &g_c) != FX_OK) {
        fxt_etcd_destroy(&etcd);
        return 1;
    }
    static const cfg rows[] = {
        {1, 127, 128, false},  {1, 127, 128, true},  {4, 127, 128, false}, {4, 127, 128, true},
        {4, 127, 4096, false}, {4, 127, 4096, true}, {4, 250, 4096, true},
    };
    printf("| threads | batch | size | payload | msgs/s | payload MB/s |\n"
           "|---|---|---|---|---|---|\n");
    int rc = 0;
    for (size_t r = 0; r < sizeof rows / sizeof rows[0] && !atomic_load(&g_stop); r++) {
        const cfg *cf = &rows[r];
        wk w[MAX_T] = {0};
        pthread_t th[MAX_T];
        atomic_store(&g_row_stop, false);
        double t0 = now_s();
        int started = 0;
        for (int i = 0; i < cf->threads; i++) {
            w[i] = (wk){.cf = cf, .id = (long)(r * MAX_T + (size_t)i)};
            if (pthread_create(&th[i], NULL, worker, &w[i]) != 0) break;
            started++;
        }
        for (double end = t0 + dur; now_s() < end && !atomic_load(&g_stop);) {
            struct timespec d = {0, 50 * 1000 * 1000};
            nanosleep(&d, NULL);
        }
        atomic_store(&g_row_stop, true);
        long long msgs = 0;
        for (int i = 0; i < started; i++) {
            pthread_join(th[i], NULL);
            msgs += w[i].msgs;
            if (w[i].failed) rc = 1;
        }
        if (started < cf->threads) rc = 1;
        double secs = now_s() - t0, rate = msgs / secs;
        printf("| %d | %d | %s | %s | %.0f | %.1f |\n", cf->threads, cf->batch,
               cf->size == 4096 ? "4 KiB" : "128 B", cf->segment ? "segment" : "key per msg", rate,
               rate * (double)cf->size / 1e6);
        fflush(stdout);
        compact();
    }
    fx_etcd_free(g_c);
    fxt_etcd_destroy(&etcd);
    return atomic_load(&g_stop) ? 1 : rc;
}
