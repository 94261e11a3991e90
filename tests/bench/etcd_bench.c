/* etcd_bench.c -- our etcd client (fx_etcd_put / fx_etcd_txn) vs a raw libcurl baseline, same run.
 *
 *   etcd_bench [-d seconds] [-w warmup_ms] [-c N] [-r pairs] [-q]
 *
 * Starts its own etcd on free loopback ports (tests/support/fxt), or uses $FX_ETCD_ENDPOINT.
 * Workloads: put 128 B, put 4 KiB, txn (1 compare + 1 put, 128 B); each at concurrency 1 and N
 * (default 8) threads. Every thread makes its own synchronous calls:
 *   raw: one persistent curl easy handle per thread, hand-built JSON (snprintf + base64), POST
 *        /v3/kv/put or /v3/kv/txn, checks HTTP 200 (and "succeeded":true for txn);
 *   fx:  one shared fx_etcd client (its connection pool), fx_etcd_put / fx_etcd_txn.
 * Each (workload, conc) runs raw, fx, fx, raw (ABBA, `pairs` times; default 1): drift cancels;
 * the table shows the mean (ops/s = total ops / total measured time; percentiles of the merged
 * latency histograms). Each run: warm-up (default 500 ms, not measured), then `seconds` measured
 * (default 5); ops count when they start after the warm-up and end before the deadline. Between
 * runs the keyspace is compacted (untimed). Keys cycle through 1024 per thread, so etcd's live
 * keyspace stays bounded.
 *
 * Output: one markdown table on stdout (progress on stderr). Exit 1 if any run saw errors.
 * No process is left behind: the etcd child dies with us (PR_SET_PDEATHSIG) and is destroyed
 * at exit, also after SIGINT/SIGTERM (which end the current run early).
 */
#include <curl/curl.h>
#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "etcd.h"
#include "tests/support/fxt.h"

#define MAX_CONC 256
#define HIST_STEP_US 5
#define HIST_BUCKETS 200000 /* 5 us .. 1 s; slower ops land in the last bucket */
#define KEYS_PER_THREAD 1024
#define CALL_TIMEOUT_MS 5000

static atomic_bool g_stop;

static void on_signal(int sig)
{
    (void)sig;
    atomic_store(&g_stop, true);
}

static int64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* ---- latency histogram ------------------------------------------------------------------- */

typedef struct hist {
    uint32_t *b;
    uint64_t n;
} hist;

static void hist_add(hist *h, int64_t us)
{
    int64_t i = us / HIST_STEP_US;
    if (i >= HIST_BUCKETS) i = HIST_BUCKETS - 1;
    if (i < 0) i = 0;
    h->b[i]++;
    h->n++;
}

static void hist_merge(hist *into, const hist *from)
{
    for (size_t i = 0; i < HIST_BUCKETS; i++) into->b[i] += from->b[i];
    into->n += from->n;
}

static double hist_pct_ms(const hist *h, double p)
{
    if (!h->n) return 0;
    uint64_t want = (uint64_t)(p * (double)h->n + 0.999999), acc = 0;
    if (want == 0) want = 1;
    for (size_t i = 0; i < HIST_BUCKETS; i++) {
        acc += h->b[i];
        if (acc >= want) return ((double)i + 0.5) * HIST_STEP_US / 1000.0;
    }
    return (double)HIST_BUCKETS * HIST_STEP_US / 1000.0;
}

/* ---- raw baseline: base64 + snprintf + curl easy ------------------------------------------- */

static size_t b64(const uint8_t *in, size_t n, char *out)
{
    static const char a[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t o = 0, i = 0;
    for (; i + 2 < n; i += 3) {
        uint32_t v = (uint32_t)in[i] << 16 | (uint32_t)in[i + 1] << 8 | in[i + 2];
        out[o++] = a[v >> 18];
        out[o++] = a[(v >> 12) & 63];
        out[o++] = a[(v >> 6) & 63];
        out[o++] = a[v & 63];
    }
    if (i < n) {
        uint32_t v = (uint32_t)in[i] << 16 | (i + 1 < n ? (uint32_t)in[i + 1] << 8 : 0);
        out[o++] = a[v >> 18];
        out[o++] = a[(v >> 12) & 63];
        out[o++] = i + 1 < n ? a[(v >> 6) & 63] : '=';
        out[o++] = '=';
    }
    out[o] = 0;
    return o;
}

typedef struct rbuf {
    char d[4096];
    size_t n;
} rbuf;

static size_t raw_write(char *p, size_t sz, size_t nm, void *arg)
{
    rbuf *r = arg;
    size_t len = sz * nm, room = sizeof r->d - 1 - r->n;
    size_t c = len < room ? len : room;
    memcpy(r->d + r->n, p, c);
    r->n += c;
    r->d[r->n] = 0;
    return len;
}

/* ---- runs ---------------------------------------------------------------------------------- */

enum { W_PUT = 0, W_TXN = 1 };
enum { K_RAW = 0, K_FX = 1 };

typedef struct workload {
    const char *name;
    int kind;
    size_t size;
    const char *size_name;
} workload;

typedef struct run_ctx {
    const workload *w;
    int impl;
    int conc;
    const char *endpoint;
    fx_etcd *fx;
    int64_t t_start, t_warm_end, t_end; /* us */
} run_ctx;

typedef struct worker {
    run_ctx *rc;
    int id;
    pthread_t th;
    hist h;
    uint64_t errors;
    char first_err[256];
} worker;

static void note_err(worker *wk, const char *fmt, const char *a, long b)
{
    if (wk->errors++ == 0) snprintf(wk->first_err, sizeof wk->first_err, fmt, a, b);
}

static void *worker_main(void *arg)
{
    worker *wk = arg;
    run_ctx *rc = wk->rc;
    const workload *w = rc->w;
    uint8_t *val = malloc(w->size);
    size_t b64cap = (w->size + 64) / 3 * 4 + 8;
    char *bval = malloc(b64cap), bkey[128];
    size_t bodycap = b64cap + 512;
    char *body = malloc(bodycap);
    CURL *cu = NULL;
    struct curl_slist *hdr = NULL;
    char url[160];
    rbuf rb;
    if (!val || !bval || !body) {
        note_err(wk, "%s%ld", "out of memory", 0);
        goto out;
    }
    for (size_t i = 0; i < w->size; i++) val[i] = (uint8_t)(i * 131 + (size_t)wk->id);
    if (rc->impl == K_RAW) {
        cu = curl_easy_init();
        hdr = curl_slist_append(NULL, "Content-Type: application/json");
        hdr = curl_slist_append(hdr, "Expect:");
        if (!cu || !hdr) {
            note_err(wk, "%s%ld", "curl init failed", 0);
            goto out;
        }
        snprintf(url, sizeof url, "%s%s", rc->endpoint, w->kind == W_PUT ? "/v3/kv/put" : "/v3/kv/txn");
        curl_easy_setopt(cu, CURLOPT_URL, url);
        curl_easy_setopt(cu, CURLOPT_HTTPHEADER, hdr);
        curl_easy_setopt(cu, CURLOPT_NOSIGNAL, 1L);
        curl_easy_setopt(cu, CURLOPT_TIMEOUT_MS, (long)CALL_TIMEOUT_MS);
        curl_easy_setopt(cu, CURLOPT_WRITEFUNCTION, raw_write);
        curl_easy_setopt(cu, CURLOPT_WRITEDATA, &rb);
        curl_easy_setopt(cu, CURLOPT_POST, 1L);
    }
    char key[96];
    for (uint64_t i = 0; !atomic_load_explicit(&g_stop, memory_order_relaxed); i++) {
        int64_t t0 = now_us();
        if (t0 >= rc->t_end) break;
        int klen = snprintf(key, sizeof key, "/bench/%s/%d/%04u", w->kind == W_PUT ? "put" : "txn",
                            wk->id, (unsigned)(i % KEYS_PER_THREAD));
        val[0] = (uint8_t)i; /* every write changes the value */
        bool ok;
        if (rc->impl == K_RAW) {
            b64((const uint8_t *)key, (size_t)klen, bkey);
            b64(val, w->size, bval);
            int blen;
            if (w->kind == W_PUT)
                blen = snprintf(body, bodycap, "{\"key\":\"%s\",\"value\":\"%s\"}", bkey, bval);
            else
                blen = snprintf(body, bodycap,
                                "{\"compare\":[{\"key\":\"%s\",\"target\":\"VERSION\","
                                "\"result\":\"GREATER\",\"version\":\"-1\"}],"
                                "\"success\":[{\"request_put\":{\"key\":\"%s\",\"value\":\"%s\"}}]}",
                                bkey, bkey, bval);
            rb.n = 0;
            rb.d[0] = 0;
            curl_easy_setopt(cu, CURLOPT_POSTFIELDS, body);
            curl_easy_setopt(cu, CURLOPT_POSTFIELDSIZE, (long)blen);
            CURLcode cc = curl_easy_perform(cu);
            long code = 0;
            curl_easy_getinfo(cu, CURLINFO_RESPONSE_CODE, &code);
            ok = cc == CURLE_OK && code == 200 &&
                 (w->kind == W_PUT || strstr(rb.d, "\"succeeded\":true") != NULL);
            if (!ok) note_err(wk, "raw: %s (HTTP %ld)", curl_easy_strerror(cc), code);
        } else {
            fx_slice k = {key, (size_t)klen}, v = {val, w->size};
            fx_err e;
            if (w->kind == W_PUT) {
                fx_put_req req = {.key = k, .value = v};
                e = fx_etcd_put(rc->fx, &req, NULL, CALL_TIMEOUT_MS);
                ok = e == FX_OK;
            } else {
                fx_cmp cmp = {.target = FX_CMP_VERSION, .result = FX_CMP_GREATER, .key = k, .num = -1};
                fx_op op = {.type = FX_OP_PUT, .u.put = {.key = k, .value = v}};
                fx_txn_req req = {.cmp = &cmp, .n_cmp = 1, .success = &op, .n_success = 1};
                fx_txn_resp resp = {0};
                e = fx_etcd_txn(rc->fx, &req, &resp, CALL_TIMEOUT_MS);
                ok = e == FX_OK && resp.succeeded;
                fx_txn_resp_free(&resp);
            }
            if (!ok) note_err(wk, "fx: %s (%ld)", e ? fx_errname(e) : "txn not succeeded", (long)e);
        }
        int64_t t1 = now_us();
        if (ok && t0 >= rc->t_warm_end && t1 <= rc->t_end) hist_add(&wk->h, t1 - t0);
    }
out:
    if (cu) curl_easy_cleanup(cu);
    curl_slist_free_all(hdr);
    free(body);
    free(bval);
    free(val);
    return NULL;
}

typedef struct result {
    hist h;
    double secs;
    uint64_t errors;
    double cpu_s; /* our process CPU (user+sys) */
} result;

static double cpu_now(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
}

/* One run; merges into *res. Returns 0, or -1 when threads could not be started. */
static int run_once(run_ctx *rc, int64_t warm_ms, int64_t dur_ms, result *res)
{
    worker *wk = calloc((size_t)rc->conc, sizeof *wk);
    if (!wk) return -1;
    int started = 0, rcode = 0;
    rc->t_start = now_us() + 20000; /* let every thread start first */
    rc->t_warm_end = rc->t_start + warm_ms * 1000;
    rc->t_end = rc->t_warm_end + dur_ms * 1000;
    double cpu0 = cpu_now();
    for (int i = 0; i < rc->conc; i++) {
        wk[i].rc = rc;
        wk[i].id = i;
        wk[i].h.b = calloc(HIST_BUCKETS, sizeof *wk[i].h.b);
        if (!wk[i].h.b || pthread_create(&wk[i].th, NULL, worker_main, &wk[i]) != 0) {
            free(wk[i].h.b);
            wk[i].h.b = NULL;
            atomic_store(&g_stop, true);
            rcode = -1;
            break;
        }
        started++;
    }
    for (int i = 0; i < started; i++) pthread_join(wk[i].th, NULL);
    double cpu1 = cpu_now();
    int64_t measured_end = now_us();
    if (measured_end > rc->t_end) measured_end = rc->t_end;
    uint64_t n0 = res->h.n;
    for (int i = 0; i < started; i++) {
        hist_merge(&res->h, &wk[i].h);
        res->errors += wk[i].errors;
        if (wk[i].errors)
            fprintf(stderr, "  thread %d: %" PRIu64 " errors, first: %s\n", i, wk[i].errors,
                    wk[i].first_err);
        free(wk[i].h.b);
    }
    double secs = (double)(measured_end - rc->t_warm_end) / 1e6;
    if (secs < 0) secs = 0;
    res->secs += secs;
    res->cpu_s += cpu1 - cpu0;
    fprintf(stderr, "  %-3s %-4s %-6s c=%-3d %8.0f ops/s  p50 %.2f ms  (cpu %.0f%%)\n",
            rc->impl == K_RAW ? "raw" : "fx", rc->w->kind == W_PUT ? "put" : "txn",
            rc->w->size_name, rc->conc, secs > 0 ? (double)(res->h.n - n0) / secs : 0.0,
            hist_pct_ms(&res->h, 0.5),
            100.0 * (cpu1 - cpu0) / ((double)(rc->t_end - rc->t_start) / 1e6));
    free(wk);
    return rcode;
}

static void compact(fx_etcd *c)
{
    fx_etcd_status st;
    if (fx_etcd_status_get(c, &st, CALL_TIMEOUT_MS) == FX_OK && st.revision > 1) {
        fx_err e = fx_etcd_compact(c, st.revision, 30000);
        if (e != FX_OK && e != FX_ECOMPACTED)
            fprintf(stderr, "  compact: %s (%s)\n", fx_errname(e), fx_err_detail());
    }
}

static void usage(const char *p)
{
    fprintf(stderr,
            "usage: %s [-d seconds] [-w warmup_ms] [-c N] [-r pairs] \n"
            "  -d  measured seconds per run (default 5)\n"
            "  -w  warm-up milliseconds per run (default 500)\n"
            "  -c  the higher concurrency (default 8; 1 is always run too)\n"
            "  -r  ABBA repetitions per cell: raw,fx,fx,raw (default 1)\n"
            "  FX_ETCD_ENDPOINT=http://host:port uses that etcd instead of starting one\n",
            p);
}

int main(int argc, char **argv)
{
    int64_t dur_s = 5, warm_ms = 500;
    int conc_n = 8, pairs = 1, opt;
    while ((opt = getopt(argc, argv, "d:w:c:r:h")) != -1) {
        switch (opt) {
        case 'd': dur_s = atoll(optarg); break;
        case 'w': warm_ms = atoll(optarg); break;
        case 'c': conc_n = atoi(optarg); break;
        case 'r': pairs = atoi(optarg); break;
        default: usage(argv[0]); return opt == 'h' ? 0 : 2;
        }
    }
    if (dur_s < 1 || dur_s > 3600 || warm_ms < 0 || warm_ms > 60000 || conc_n < 1 ||
        conc_n > MAX_CONC || pairs < 1 || pairs > 20) {
        usage(argv[0]);
        return 2;
    }

    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
        fprintf(stderr, "curl_global_init failed\n");
        return 1;
    }
    fxt_etcd etcd = {0};
    const char *ep = getenv("FX_ETCD_ENDPOINT");
    bool own = !(ep && *ep);
    if (own) {
        if (fxt_etcd_start(&etcd) != 0) {
            fprintf(stderr, "cannot start etcd\n");
            curl_global_cleanup();
            return 1;
        }
        ep = etcd.endpoint;
    }
    int rcode = 0;
    fx_etcd *c = NULL;
    const char *eps[] = {ep};
    fx_etcd_opts o = {.endpoints = eps, .n_endpoints = 1};
    fx_err e = fx_etcd_new(&o, &c);
    fx_etcd_status st = {0};
    if (e == FX_OK) e = fx_etcd_status_get(c, &st, CALL_TIMEOUT_MS);
    if (e != FX_OK) {
        fprintf(stderr, "etcd at %s: %s (%s)\n", ep, fx_errname(e), fx_err_detail());
        rcode = 1;
        goto done;
    }
    fprintf(stderr, "etcd %s at %s (%s); %" PRId64 " s per run after %" PRId64
                    " ms warm-up; %d x raw,fx,fx,raw per cell\n",
            st.version, ep, own ? "started by the bench" : "FX_ETCD_ENDPOINT", dur_s, warm_ms, pairs);

    static const workload W[] = {
        {"put", W_PUT, 128, "128 B"},
        {"put", W_PUT, 4096, "4 KiB"},
        {"txn (1 cmp + 1 put)", W_TXN, 128, "128 B"},
    };
    int concs[2] = {1, conc_n};
    int n_conc = conc_n == 1 ? 1 : 2;
    char table[8192];
    size_t tl = 0;
    char cpu_table[4096];
    size_t cl = 0;
    tl += (size_t)snprintf(table + tl, sizeof table - tl,
                           "| workload | conc | size | raw ops/s | raw p50/p99 ms | fx ops/s | "
                           "fx p50/p99 ms | fx/raw |\n|---|---|---|---|---|---|---|---|\n");
    cl += (size_t)snprintf(cpu_table + cl, sizeof cpu_table - cl,
                           "| workload | conc | size | raw client CPU us/op | fx client CPU us/op |\n"
                           "|---|---|---|---|---|\n");
    for (size_t wi = 0; wi < sizeof W / sizeof W[0] && !atomic_load(&g_stop); wi++) {
        for (int ci = 0; ci < n_conc && !atomic_load(&g_stop); ci++) {
            result res[2] = {0};
            for (int k = 0; k < 2; k++) {
                res[k].h.b = calloc(HIST_BUCKETS, sizeof *res[k].h.b);
                if (!res[k].h.b) {
                    fprintf(stderr, "out of memory\n");
                    atomic_store(&g_stop, true);
                }
            }
            static const int order[4] = {K_RAW, K_FX, K_FX, K_RAW};
            for (int p = 0; p < pairs * 4 && !atomic_load(&g_stop); p++) {
                run_ctx rc = {.w = &W[wi], .impl = order[p % 4], .conc = concs[ci],
                              .endpoint = ep, .fx = c};
                if (run_once(&rc, warm_ms, dur_s * 1000, &res[rc.impl]) != 0) rcode = 1;
                compact(c);
            }
            if (!atomic_load(&g_stop)) {
                double ops[2];
                for (int k = 0; k < 2; k++) {
                    ops[k] = res[k].secs > 0 ? (double)res[k].h.n / res[k].secs : 0;
                    if (res[k].errors) rcode = 1;
                }
                tl += (size_t)snprintf(
                    table + tl, sizeof table - tl,
                    "| %s | %d | %s | %.0f | %.2f / %.2f | %.0f | %.2f / %.2f | %.2f |\n",
                    W[wi].name, concs[ci], W[wi].size_name, ops[0], hist_pct_ms(&res[0].h, 0.5),
                    hist_pct_ms(&res[0].h, 0.99), ops[1], hist_pct_ms(&res[1].h, 0.5),
                    hist_pct_ms(&res[1].h, 0.99), ops[0] > 0 ? ops[1] / ops[0] : 0.0);
                cl += (size_t)snprintf(cpu_table + cl, sizeof cpu_table - cl,
                                       "| %s | %d | %s | %.0f | %.0f |\n", W[wi].name, concs[ci],
                                       W[wi].size_name,
                                       res[0].h.n ? res[0].cpu_s * 1e6 / (double)res[0].h.n : 0.0,
                                       res[1].h.n ? res[1].cpu_s * 1e6 / (double)res[1].h.n : 0.0);
            }
            free(res[0].h.b);
            free(res[1].h.b);
        }
    }
    if (atomic_load(&g_stop)) {
        fprintf(stderr, "interrupted\n");
        rcode = 1;
    }
    printf("%s\n%s", table, cpu_table);
    fflush(stdout);
done:
    fx_etcd_free(c);
    if (own) fxt_etcd_destroy(&etcd);
    curl_global_cleanup();
    return rcode;
}
