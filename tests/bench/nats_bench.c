/* nats_bench.c -- fluxon-bridge vs JetStream WorkQueue vs NATS core, same machine, same run.
 *
 *   nats_bench [-d seconds] [-w warmup_ms] [-b bridge_binary] [-D drain_ms] [-W window] [-P pubs]
 *              [-o scenarios] [-s sizes] [-M]
 *   nats_bench -S seconds [-s size] [-w warmup_ms] [-b bridge_binary] [-D drain_ms] [-W window]
 *
 * Starts its own etcd (tests/support/fxt), nats-server (monitoring, leafnodes listener, JetStream
 * file store) and fluxon-bridge (path from -b, else $BUILD/fluxon-bridge, else build/fluxon-bridge)
 * on free loopback ports, with data under a fresh temp dir in $FXT_TMPDIR (else /tmp). Children get
 * PR_SET_PDEATHSIG=SIGKILL and are stopped, and the temp dir removed, at exit (also after SIGINT /
 * SIGTERM, which end the current row early).
 *
 * Scenarios (each with 128 B and 4 KiB messages; -o "1,2,3,4,5" selects):
 *   1   NATS core: one publisher connection -> one async subscriber connection.
 *   2   JetStream WorkQueue stream, file, R1: js_PublishAsync (AckHandler, window) + one pull
 *       consumer (Fetch 100, natsMsg_Ack each).
 *   3   JetStream js_Publish, one at a time (publish-ack round trip).
 *   4a  bridge: 1 publisher, consumer name c1.  4b: 1 publisher, names c1..c4.  4c: P publishers
 *       (default 4), names c1..c4. Publishers publish to bench.x with a reply inbox (window of
 *       in-flight PubAcks); consumers ack every delivery with "+ACK" to its reply subject.
 *   5   bridge: natsConnection_Request to bench.x one at a time (timeout 5 s), consumer c1 acking.
 *   5n  the same with no consumer while measuring (like row 3, which has none); the stored
 *       messages are drained by a c1 consumer after the window (untimed).
 * Scenario 6 (raw etcd rate: etcd_bench's txn rows, and payload_bench, the MQ's per-batch etcd
 * work without MQ code) is run by tests/bench/run.sh.
 * Before each bridge row the bench waits until the bridge holds no claim (/metrics fluxon_claims
 * == 0; the channel's release_after is 1 s), so a row never routes into the previous row's
 * consumers' sub-MPSCs.
 *
 * Every message carries its publish time (CLOCK_REALTIME ns, bytes 0..7) and the row's id
 * (bytes 8..15). A row: warm-up (-w, default 1000 ms, not counted), measured window (-d, default
 * 5 s), then a bounded drain (-D, default 15 s) in which messages published in the window may
 * still be consumed. Only messages published inside the window count; msgs/s = counted /
 * max(window, last counted consumption - window start) (row 5: PubAcked requests published in
 * the window / window; its e2e latency is that of the consumer c1). Publishers are closed-loop: at most -W
 * (default 10000) messages published but not yet consumed, and at most 1000 publishes without
 * their PubAck (JetStream async, bridge), so queues and disk stay bounded; e2e latency therefore
 * includes the queueing such a window allows. CPU% is (utime+stime) delta over the measured window
 * per wall second (100% = one core), for the bridge, etcd, nats-server and this program (client:
 * the scenario's NATS clients); bridge RSS is VmHWM, reset (clear_refs 5) at each row start.
 * etcd req/msg: delta of the bridge's fluxon_etcd_requests_total over the row / messages consumed
 * (the whole row, drain included: in 5n that is the consumer's catch-up after the window).
 *
 * -M: every bridge publish carries a unique Nats-Msg-Id header (the bridge's dedup then looks up
 * and records every id: one txn each per batch); the rows measure the cost of dedup.
 * -K plane: the bridge's payload plane: "etcd" (default: kv.backend etcd on the control-plane
 * etcd, the fused txn), "redis-everysec" or "redis-always" (kv.backend redis on a redis-server
 * started here with appendonly yes and that appendfsync; the split plane). Printed in the header.
 *
 * After the main table, a CPU-per-message table: CPU microseconds per message (utime+stime over the
 * measured window / messages of the row in the window, i.e. CPU% / msgs/s) of the bridge, etcd,
 * nats-server, redis-server (-K redis-*) and this program, and their sum.
 *
 * -X: the bridge talks to etcd through a counting proxy (tests/support/fxt_proxy, inside this
 * program: it adds a hop to every etcd call and its CPU shows in the client column), and a third
 * table gives etcd requests, request bytes and answer bytes per consumed message by kind: the
 * fused payload+offset txn, the producer offset txn, consumer offset commits, attempt records,
 * watches (bytes of the stream), lease keepalives, other lease calls, range reads (views,
 * backlog, claims) and the rest. Use it for counts, not for the rates of the main table.
 * -T transport: the bridge's etcd.transport ("grpc": KV calls over etcd's gRPC API, or "json":
 * all over the JSON gateway); without -T the config leaves it out (the bridge's default). -X
 * counts HTTP/1.1 requests, so it sets "json" unless -T says otherwise.
 * -J: the bridge's config carries no jetstream.domain key (for comparing with bridges that predate
 * it and refuse it; such a bridge answers no JetStream API, so rows 2 and 3 are still JetStream's).
 * -p 'command': run `sh -c command` at each row's window start (for -d seconds), with BRIDGE_PID,
 * ETCD_PID, NATS_PID, REDIS_PID (0 without Redis), BENCH_PID, ROW, SIZE and WINDOW_S in its
 * environment; the row waits for it to exit (tests/bench/profile.sh runs `perf record` so).
 *
 * FX_BENCH_ETCD_ARGS="--unsafe-no-fsync" (any extra etcd flags) runs the same rows against an etcd
 * with those flags, for what-if comparisons; the flags are printed above the table.
 * Output: one markdown table and ratio lines on stdout; progress on stderr. Exit 0 when every row
 * ran without error, 1 otherwise (a failed row prints its error in the note column).
 *
 * Soak mode (-S seconds, at least 20; -d and -o do not apply): does the bridge's memory stay flat
 * under sustained full load? Runs scenario 4a's traffic (1 publisher with PubAcks, consumer c1
 * acking each delivery, the same closed loop) as one row whose window is -S seconds, with one size
 * (-s, default 128). etcd is started with --auto-compaction-mode=periodic
 * --auto-compaction-retention=1m so its db does not fill up. Every 10 s of the window it prints a
 * markdown table row: elapsed s, msgs/s consumed in the interval, bridge VmRSS and VmHWM MiB
 * (HWM reset at the window start), bridge CPU% in the interval, etcd db size MiB (total / in use,
 * from etcd's /metrics) and published-not-consumed messages. Then a summary: messages, mean rate,
 * peak RSS (VmHWM over the window and the drain), the RSS reference (the sample at 60 s; for
 * soaks under 120 s the sample at half the soak) and the max RSS of the last minute (the samples
 * after the reference for soaks under 120 s), with growth in MiB and %, and the verdict:
 * "soak: PASS" when peak RSS < 64 MiB and last-minute max <= reference * 1.10 + 2 MiB, else
 * "soak: FAIL (reasons)". Exit 0 on PASS, 1 on FAIL or when the row has an error (stall, drain
 * timeout = lost messages, error PubAcks, bridge died), 130 when interrupted (SIGINT / SIGTERM
 * end the soak early and tear everything down as in the normal mode).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <curl/curl.h>
#include <errno.h>
#include <execinfo.h>
#include <fcntl.h>
#include <ftw.h>
#include <getopt.h>
#include <inttypes.h>
#include <nats/nats.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/support/fxt.h"
#include "tests/support/fxt_proxy.h"

#define MAX_PUBS 16
#define MAX_NAMES 4
#define PUB_WINDOW 1000
#define HB_FINE 10000   /* 2 us buckets up to 20 ms */
#define HB_COARSE 60000 /* then 1 ms buckets up to 80 s */
#define STALL_MS 10000  /* no progress for this long ends a row with an error */
#define BENCH_RELEASE_MS 1000 /* the bench channel's release_after: claims left by a row go soon */

static atomic_bool g_stop;
static void on_signal(int sig) { (void)sig; atomic_store(&g_stop, true); }

/* A crash names the row it happened in and prints a backtrace on stderr (then the default action:
 * a core dump where enabled), so a rare crash in a long `make bench` can be traced. */
static char g_row_label[160] = "nats_bench: crashed before the first row\n";

static void on_fatal(int sig)
{
    static const char hdr[] = "nats_bench: fatal signal in ";
    ssize_t w = write(2, hdr, sizeof hdr - 1);
    w = write(2, g_row_label, strlen(g_row_label));
    void *bt[64];
    int n = backtrace(bt, 64);
    backtrace_symbols_fd(bt, n, 2);
    (void)w;
    signal(sig, SIG_DFL);
    raise(sig);
}

static void install_fatal_handlers(void)
{
    void *bt[4];
    backtrace(bt, 4); /* loads libgcc now: the handler must not allocate */
    struct sigaction sa = {0};
    sa.sa_handler = on_fatal;
    sa.sa_flags = SA_RESETHAND;
    sigaction(SIGSEGV, &sa, NULL);
    sigaction(SIGBUS, &sa, NULL);
    sigaction(SIGABRT, &sa, NULL);
    sigaction(SIGFPE, &sa, NULL);
}

static int64_t rt_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void sleep_us(long us)
{
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

static void logf_(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "nats_bench: ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

/* ---- histogram (ns in, ms out) ------------------------------------------------------------- */

typedef struct hist {
    pthread_mutex_t mu;
    uint32_t b[HB_FINE + HB_COARSE];
    uint64_t n;
} hist;

static void hist_add(hist *h, int64_t ns)
{
    int64_t us = ns / 1000;
    if (us < 0) us = 0;
    int64_t i = us < 2 * HB_FINE ? us / 2 : HB_FINE + (us - 2 * HB_FINE) / 1000;
    if (i >= HB_FINE + HB_COARSE) i = HB_FINE + HB_COARSE - 1;
    pthread_mutex_lock(&h->mu);
    h->b[i]++;
    h->n++;
    pthread_mutex_unlock(&h->mu);
}

static double hist_pct_ms(hist *h, double p)
{
    if (!h->n) return -1;
    uint64_t want = (uint64_t)(p * (double)h->n + 0.999999), acc = 0;
    if (want == 0) want = 1;
    for (int64_t i = 0; i < HB_FINE + HB_COARSE; i++) {
        acc += h->b[i];
        if (acc >= want)
            return i < HB_FINE ? (i * 2 + 1) / 1000.0 : (2.0 * HB_FINE + (i - HB_FINE) * 1000 + 500) / 1000.0;
    }
    return -1;
}

/* ---- processes ------------------------------------------------------------------------------ */

static char g_tmp[512];      /* our temp dir */
static pid_t g_nats_pid, g_bridge_pid;
static fxt_etcd g_etcd;
static fxt_redis g_redis;        /* -K redis-*: the payload plane */
static bool g_count_kinds;       /* -X */
static bool g_no_js_domain;      /* -J */
static bool g_leaf_pubacks;      /* -L */
static const char *g_plane = "etcd";
static const char *g_transport;   /* -T: etcd.transport of the bridge (NULL: its default) */
static int g_nats_port, g_mon_port, g_leaf_port, g_http_port;
static char g_nats_url[64];

static void write_pidfile(const char *tag, pid_t pid)
{
    char p[600];
    snprintf(p, sizeof p, "%s-%s.pid", g_tmp, tag);
    FILE *f = fopen(p, "w");
    if (f) {
        fprintf(f, "%d\n", (int)pid);
        fclose(f);
    }
}

static void remove_pidfile(const char *tag)
{
    char p[600];
    snprintf(p, sizeof p, "%s-%s.pid", g_tmp, tag);
    unlink(p);
}

static pid_t spawn(const char *tag, char *const argv[], const char *logpath)
{
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(127);
        int fd = open(logpath, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            close(fd);
        }
        int nul = open("/dev/null", O_RDONLY);
        if (nul >= 0) dup2(nul, 0);
        signal(SIGINT, SIG_DFL);
        signal(SIGTERM, SIG_DFL);
        execvp(argv[0], argv);
        _exit(127);
    }
    write_pidfile(tag, pid);
    return pid;
}

static void stop_child(const char *tag, pid_t *pidp)
{
    pid_t pid = *pidp;
    if (pid <= 0) return;
    kill(pid, SIGTERM);
    int64_t deadline = fxt_now_ms() + 5000;
    for (;;) {
        pid_t r = waitpid(pid, NULL, WNOHANG);
        if (r == pid || (r < 0 && errno == ECHILD)) break;
        if (fxt_now_ms() > deadline) {
            kill(pid, SIGKILL);
            waitpid(pid, NULL, 0);
            break;
        }
        sleep_us(20000);
    }
    *pidp = 0;
    remove_pidfile(tag);
}

static bool child_alive(pid_t pid)
{
    if (pid <= 0) return false;
    return waitpid(pid, NULL, WNOHANG) == 0;
}

static int rm_cb(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    remove(p);
    return 0;
}

static pid_t g_hook_pid;

/* ---- -X: etcd requests by kind, through a counting proxy -------------------------------------- */

static fxt_proxy *g_px;
enum {
    PK_FUSED, PK_PAYLOAD, PK_POFF, PK_COFF, PK_ATT, PK_FETCH, PK_DEL, PK_RANGE, PK_WATCH, PK_KEEPALIVE,
    PK_LEASE, PK_OTHER_W, PK_OTHER, PK_N
};
static const char *const k_pk_name[PK_N] = {
    "payload+offset txn (fused)", "payload put (no offset)", "producer offset txn",
    "consumer offset commit (+ payload delete)", "attempt record", "payload fetch (range)", "payload delete",
    "other range read (views, backlog, claims)", "watch (stream bytes)", "lease keepalive",
    "other lease call", "other put / txn / delete", "other",
};

/* The kind of one etcd JSON-gateway request: its path and the keys in its body (base64). */
static int px_classify(const char *line, size_t ll, const char *body, size_t bl)
{
    char path[96];
    const char *sp = memchr(line, ' ', ll);
    size_t pl = 0;
    if (sp) {
        const char *p0 = sp + 1, *p1 = memchr(p0, ' ', ll - (size_t)(p0 - line));
        pl = p1 ? (size_t)(p1 - p0) : ll - (size_t)(p0 - line);
        if (pl >= sizeof path) pl = sizeof path - 1;
        memcpy(path, p0, pl);
    }
    path[pl] = 0;
    if (strstr(path, "/watch")) return PK_WATCH;
    if (strstr(path, "/lease/keepalive")) return PK_KEEPALIVE;
    if (strstr(path, "/lease/")) return PK_LEASE;
    bool msg = false, poff = false, coff = false, att = false;
    for (const char *b = body, *e = body + bl; b < e;) {
        const char *k = memmem(b, (size_t)(e - b), "\"key\":\"", 7);
        if (!k) break;
        k += 7;
        const char *q = memchr(k, '"', (size_t)(e - k));
        if (!q) break;
        char key[600];
        fxt_proxy_unb64(k, (size_t)(q - k), key, sizeof key);
        if (strstr(key, "_msg_") || strstr(key, "/msg_")) msg = true;
        if (strstr(key, "producer_offset_of_all_producer")) poff = true;
        if (strstr(key, "consumer_offset_of_all_producer")) coff = true;
        if (strstr(key, "/attempts/")) att = true;
        b = q + 1;
    }
    bool range = strstr(path, "/kv/range") != NULL;
    if (range) return msg ? PK_FETCH : PK_RANGE;
    if (!strstr(path, "/kv/")) return PK_OTHER;
    if (msg && strstr(path, "/kv/deleterange")) return PK_DEL;
    if (msg && poff) return PK_FUSED;
    if (coff) return PK_COFF; /* the commit txn also deletes the committed payload keys */
    if (att) return PK_ATT;
    if (msg) return PK_PAYLOAD;
    if (poff) return PK_POFF;
    return PK_OTHER_W;
}

static void px_snap(fxt_proxy_class_stats *st)
{
    for (int i = 0; i < PK_N; i++) fxt_proxy_class_stats_get(g_px, i, &st[i]);
}

static int port_of(const char *url)
{
    const char *c = strrchr(url, ':');
    return c ? atoi(c + 1) : 0;
}

static void cleanup_all(void)
{
    if (g_hook_pid > 0) {
        kill(g_hook_pid, SIGTERM);
        waitpid(g_hook_pid, NULL, 0);
        g_hook_pid = 0;
    }
    stop_child("bridge", &g_bridge_pid);
    fxt_proxy_stop(g_px);
    g_px = NULL;
    stop_child("nats", &g_nats_pid);
    fxt_etcd_destroy(&g_etcd);
    fxt_redis_destroy(&g_redis);
    if (g_tmp[0]) {
        nftw(g_tmp, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
        g_tmp[0] = 0;
    }
}

/* ---- HTTP + /proc ------------------------------------------------------------------------- */

typedef struct buf {
    char *d;
    size_t n, cap;
} buf;

static size_t buf_write(char *p, size_t sz, size_t nm, void *arg)
{
    buf *b = arg;
    size_t len = sz * nm;
    if (b->n + len + 1 > b->cap) {
        size_t nc = (b->n + len + 1) * 2;
        char *nd = realloc(b->d, nc);
        if (!nd) return 0;
        b->d = nd;
        b->cap = nc;
    }
    memcpy(b->d + b->n, p, len);
    b->n += len;
    b->d[b->n] = 0;
    return len;
}

/* GET url; returns the HTTP status (0 on failure); body in *out (caller frees) if out. */
static long http_get(const char *url, char **out)
{
    CURL *c = curl_easy_init();
    if (!c) return 0;
    buf b = {0};
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 2000L);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, buf_write);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
    long code = 0;
    if (curl_easy_perform(c) == CURLE_OK) curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
    curl_easy_cleanup(c);
    if (out) *out = b.d;
    else free(b.d);
    return code;
}

static int wait_http_ok(const char *url, pid_t pid, int timeout_ms)
{
    int64_t deadline = fxt_now_ms() + timeout_ms;
    while (fxt_now_ms() < deadline && !atomic_load(&g_stop)) {
        if (http_get(url, NULL) == 200) return 0;
        if (pid && !child_alive(pid)) return -1;
        sleep_us(50000);
    }
    return -1;
}

/* Sum of the Prometheus metric `name` at `url` over its labels (-1: unreachable). */
static double metric_sum(const char *url, const char *name)
{
    char *body = NULL;
    if (http_get(url, &body) != 200 || !body) {
        free(body);
        return -1;
    }
    double sum = 0;
    for (char *l = body; l && *l;) {
        char *nl = strchr(l, '\n');
        if (strncmp(l, name, strlen(name)) == 0 && (l[strlen(name)] == ' ' || l[strlen(name)] == '{')) {
            char *sp = strrchr(l, ' ');
            if (nl) *nl = 0;
            sp = strrchr(l, ' ');
            if (sp) sum += strtod(sp + 1, NULL);
        }
        l = nl ? nl + 1 : NULL;
    }
    free(body);
    return sum;
}

/* Sum of the bridge's metric `name` over its labels (-1: /metrics unreachable). */
static double bridge_metric_sum(const char *name)
{
    char url[128];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/metrics", g_http_port);
    return metric_sum(url, name);
}

/* etcd's metric `name` from /metrics on its client port (-1: unreachable). */
static double etcd_metric(const char *name)
{
    char url[128];
    snprintf(url, sizeof url, "%s/metrics", g_etcd.endpoint);
    return metric_sum(url, name);
}

static double bridge_etcd_requests(void) { return bridge_metric_sum("fluxon_etcd_requests_total"); }

static int64_t proc_cpu_ticks(pid_t pid)
{
    if (pid <= 0) return -1;
    char p[64], line[2048];
    snprintf(p, sizeof p, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(p, "r");
    if (!f) return -1;
    size_t n = fread(line, 1, sizeof line - 1, f);
    fclose(f);
    line[n] = 0;
    char *q = strrchr(line, ')');
    if (!q) return -1;
    unsigned long ut = 0, st = 0;
    /* after ")": state(3) ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime */
    if (sscanf(q + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2) return -1;
    return (int64_t)(ut + st);
}

/* A kB field ("VmHWM:", "VmRSS:") of /proc/<pid>/status (-1: unavailable). */
static long proc_status_kib(pid_t pid, const char *field)
{
    if (pid <= 0) return -1;
    char p[64], line[256];
    size_t fl = strlen(field);
    snprintf(p, sizeof p, "/proc/%d/status", (int)pid);
    FILE *f = fopen(p, "r");
    if (!f) return -1;
    long v = -1;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, field, fl) == 0) v = strtol(line + fl, NULL, 10);
    fclose(f);
    return v;
}

static long proc_hwm_kib(pid_t pid) { return proc_status_kib(pid, "VmHWM:"); }

static void proc_reset_hwm(pid_t pid)
{
    char p[64];
    snprintf(p, sizeof p, "/proc/%d/clear_refs", (int)pid);
    FILE *f = fopen(p, "w");
    if (f) {
        fputs("5", f);
        fclose(f);
    }
}

/* ---- stack --------------------------------------------------------------------------------- */

static int free_port(void) { return fxt_dead_port(); }

static int start_stack(const char *bridge_bin)
{
    const char *base = getenv("FXT_TMPDIR");
    if (!base || !*base) base = "/tmp";
    snprintf(g_tmp, sizeof g_tmp, "%s/nats_bench.XXXXXX", base);
    if (!mkdtemp(g_tmp)) {
        logf_("mkdtemp %s: %s", g_tmp, strerror(errno));
        g_tmp[0] = 0;
        return -1;
    }
    logf_("temp dir %s; starting etcd", g_tmp);
    if (fxt_etcd_start(&g_etcd) != 0) return -1;
    const char *bridge_etcd = g_etcd.endpoint; /* the bridge's etcd: -X puts the proxy between */
    if (g_count_kinds) {
        if (!(g_px = fxt_proxy_start(port_of(g_etcd.endpoint)))) return -1;
        fxt_proxy_set_classifier(g_px, px_classify);
        bridge_etcd = fxt_proxy_eps(g_px)[0];
    }

    g_nats_port = free_port();
    g_mon_port = free_port();
    g_leaf_port = free_port();
    g_http_port = free_port();
    char conf[600], log[600], js[600];
    snprintf(conf, sizeof conf, "%s/nats-server.conf", g_tmp);
    snprintf(log, sizeof log, "%s/nats-server.log", g_tmp);
    snprintf(js, sizeof js, "%s/js", g_tmp);
    FILE *f = fopen(conf, "w");
    if (!f) return -1;
    fprintf(f,
            "listen: \"127.0.0.1:%d\"\nhttp: \"127.0.0.1:%d\"\n"
            "leafnodes { listen: \"127.0.0.1:%d\" }\n"
            "jetstream { store_dir: \"%s\" }\n",
            g_nats_port, g_mon_port, g_leaf_port, js);
    fclose(f);
    char a0[] = "nats-server", a1[] = "-c";
    char *nargv[] = {a0, a1, conf, NULL};
    g_nats_pid = spawn("nats", nargv, log);
    char url[128];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/healthz", g_mon_port);
    if (g_nats_pid <= 0 || wait_http_ok(url, g_nats_pid, 20000) != 0) {
        logf_("nats-server did not start; see %s", log);
        return -1;
    }
    snprintf(g_nats_url, sizeof g_nats_url, "nats://127.0.0.1:%d", g_nats_port);

    char kvj[256];
    if (!strncmp(g_plane, "redis-", 6)) {
        memset(&g_redis, 0, sizeof g_redis);
        snprintf(g_redis.appendfsync, sizeof g_redis.appendfsync, "%s", g_plane + 6);
        if (fxt_redis_start(&g_redis) != 0) {
            logf_("redis-server did not start");
            return -1;
        }
        snprintf(kvj, sizeof kvj, "{\"backend\":\"redis\",\"url\":\"%s\"}", g_redis.url);
    } else {
        snprintf(kvj, sizeof kvj, "{\"backend\":\"etcd\",\"endpoints\":[\"%s\"]}", bridge_etcd);
    }
    char bconf[600], blog[600];
    snprintf(bconf, sizeof bconf, "%s/bridge.json", g_tmp);
    snprintf(blog, sizeof blog, "%s/bridge.log", g_tmp);
    f = fopen(bconf, "w");
    if (!f) return -1;
    fprintf(f,
            "{\"name\":\"nbench\",\n"
            " \"nats\":{\"url\":\"%s\",\"monitor_url\":\"http://127.0.0.1:%d\","
            "\"leaf_url\":\"nats://127.0.0.1:%d\",\"account\":\"$G\"%s},\n"
            " \"etcd\":{\"endpoints\":[\"%s\"],\"prefix\":\"/fxbench\"%s%s%s},\n"
            " \"kv\":%s,\n"
            " \"http\":{\"listen\":\"127.0.0.1:%d\"},\n"
            /* the server runs JetStream (rows 2, 3): the bridge's JetStream API goes under a
             * domain, as beside any real JetStream (-J: left out, for older bridges) */
            "%s"
            " \"channels\":[{\"name\":\"bench\",\"subjects\":[\"bench.>\"],\"deliver_prefix\":\"q.bench\","
            "\"ttl_seconds\":30,\"capacity\":1000000,\"ack\":\"explicit\",\"max_ack_pending\":5000,"
            "\"interest_poll\":\"200ms\",\"release_after\":\"%dms\"}]}\n",
            g_nats_url, g_mon_port, g_leaf_port, g_leaf_pubacks ? ",\"leaf_pubacks\":true" : "",
            bridge_etcd, g_transport ? ",\"transport\":\"" : "", g_transport ? g_transport : "",
            g_transport ? "\"" : "", kvj, g_http_port,
            g_no_js_domain ? "" : " \"jetstream\":{\"domain\":\"fxbench\"},\n",
            BENCH_RELEASE_MS);
    fclose(f);
    if (access(bridge_bin, X_OK) != 0) {
        logf_("bridge binary %s is not executable (-b)", bridge_bin);
        return -1;
    }
    char bb[512], b1[] = "-c";
    snprintf(bb, sizeof bb, "%s", bridge_bin);
    char *bargv[] = {bb, b1, bconf, NULL};
    g_bridge_pid = spawn("bridge", bargv, blog);
    snprintf(url, sizeof url, "http://127.0.0.1:%d/healthz", g_http_port);
    if (g_bridge_pid <= 0 || wait_http_ok(url, g_bridge_pid, 30000) != 0) {
        logf_("fluxon-bridge did not become healthy; see %s", blog);
        return -1;
    }
    logf_("stack up: etcd %s, nats %s, bridge pid %d", g_etcd.endpoint, g_nats_url, (int)g_bridge_pid);
    return 0;
}

/* ---- a row --------------------------------------------------------------------------------- */

typedef struct row {
    char scen[8];
    char desc[96];
    size_t size;
    uint64_t id;
    int64_t t0, t1; /* measured window, realtime ns */
    atomic_llong published, consumed, pub_acked, errors, counted, last_counted;
    atomic_llong serial_acked; /* row 5: requests published in the window and PubAcked */
    hist e2e, pack;
    bool has_e2e, has_pack, bridge;
    /* results */
    double rate, mbs, bridge_cpu, etcd_cpu, nats_cpu, client_cpu, redis_cpu, req_per_msg;
    fxt_proxy_class_stats px0[FXT_PROXY_CLASSES], px1[FXT_PROXY_CLASSES]; /* -X: at row start, end */
    long rss_kib;
    char err[200];
} row;

static void row_err(row *r, const char *fmt, ...)
{
    if (r->err[0]) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->err, sizeof r->err, fmt, ap);
    va_end(ap);
    logf_("row %s %zu B: %s", r->scen, r->size, r->err);
}

static void stamp(row *r, char *p)
{
    int64_t t = rt_ns();
    memcpy(p, &t, 8);
    memcpy(p + 8, &r->id, 8);
}

/* A consumed message: count it, and its e2e latency when published in the window. */
static void on_consumed(row *r, const char *d, int len)
{
    if (len < 16 || !d) return;
    uint64_t id;
    int64_t t;
    memcpy(&id, d + 8, 8);
    if (id != r->id) return;
    memcpy(&t, d, 8);
    atomic_fetch_add(&r->consumed, 1);
    if (t >= r->t0 && t < r->t1) {
        int64_t now = rt_ns();
        hist_add(&r->e2e, now - t);
        atomic_fetch_add(&r->counted, 1);
        atomic_store(&r->last_counted, now);
    }
}

/* Closed loop: wait until the publisher may send (false: stop, deadline or stall). */
static bool pub_gate(row *r, long long e2e_window, bool pubwin)
{
    int64_t last_progress = fxt_now_ms();
    long long seen = -1;
    for (;;) {
        if (atomic_load(&g_stop) || rt_ns() >= r->t1) return false;
        long long pub = atomic_load(&r->published);
        long long done = atomic_load(&r->consumed);
        long long acked = atomic_load(&r->pub_acked) + atomic_load(&r->errors);
        if ((e2e_window <= 0 || pub - done < e2e_window) && (!pubwin || pub - acked < PUB_WINDOW))
            return true;
        if (done + acked != seen) {
            seen = done + acked;
            last_progress = fxt_now_ms();
        } else if (fxt_now_ms() - last_progress > STALL_MS) {
            row_err(r, "stalled: %lld published, %lld consumed, %lld pub-acked", pub, done, acked);
            return false;
        }
        sleep_us(50);
    }
}

/* After the window: wait (bounded) until consumed == published and, if pubwin, all acked. */
static void drain(row *r, bool need_consume, bool pubwin, int drain_ms)
{
    int64_t deadline = fxt_now_ms() + drain_ms;
    for (;;) {
        long long pub = atomic_load(&r->published);
        bool ok = (!need_consume || atomic_load(&r->consumed) >= pub) &&
                  (!pubwin || atomic_load(&r->pub_acked) + atomic_load(&r->errors) >= pub);
        if (ok) return;
        if (atomic_load(&g_stop)) return;
        if (fxt_now_ms() > deadline) {
            row_err(r, "drain timeout: %lld published, %lld consumed, %lld pub-acked", pub,
                    (long long)atomic_load(&r->consumed), (long long)atomic_load(&r->pub_acked));
            return;
        }
        sleep_us(1000);
    }
}

/* Samples CPU of bridge / etcd / nats-server at t0 and t1. */
typedef struct sampler {
    row *r;
    pthread_t th;
    int64_t c0[5], c1[5];
    double wall_s;
} sampler;

static void sample(int64_t *c)
{
    c[0] = proc_cpu_ticks(g_bridge_pid);
    c[1] = proc_cpu_ticks(g_etcd.pid);
    c[2] = proc_cpu_ticks(g_nats_pid);
    c[3] = proc_cpu_ticks(getpid()); /* this program: the NATS clients of the scenario */
    c[4] = g_redis.pid > 0 ? proc_cpu_ticks(g_redis.pid) : -1;
}

/* Soak mode: set when the row's traffic ended before its window did (error), so the waits for the
 * window's end return at once instead of idling out a long soak. */
static atomic_bool g_row_over;

static void sleep_until_rt(int64_t t)
{
    for (;;) {
        int64_t d = t - rt_ns();
        if (d <= 0 || atomic_load(&g_stop) || atomic_load(&g_row_over)) return;
        sleep_us(d / 1000 > 50000 ? 50000 : d / 1000 + 1);
    }
}

/* -p: the window hook (a shell command run at each row's window start). */
static const char *g_hook;
static int g_dur_s; /* -d (defined with its default below) */

static pid_t hook_start(row *r)
{
    char env[8][64];
    snprintf(env[0], 64, "BRIDGE_PID=%d", (int)g_bridge_pid);
    snprintf(env[1], 64, "ETCD_PID=%d", (int)g_etcd.pid);
    snprintf(env[2], 64, "NATS_PID=%d", (int)g_nats_pid);
    snprintf(env[3], 64, "REDIS_PID=%d", (int)(g_redis.pid > 0 ? g_redis.pid : 0));
    snprintf(env[4], 64, "BENCH_PID=%d", (int)getpid());
    snprintf(env[5], 64, "ROW=%s", r->scen);
    snprintf(env[6], 64, "SIZE=%zu", r->size);
    snprintf(env[7], 64, "WINDOW_S=%d", g_dur_s);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(127);
        for (int i = 0; i < 8; i++) putenv(env[i]);
        int nul = open("/dev/null", O_RDONLY);
        if (nul >= 0) dup2(nul, 0);
        dup2(2, 1); /* its output goes to our stderr: stdout is the tables */
        signal(SIGINT, SIG_DFL);
        signal(SIGTERM, SIG_DFL);
        execl("/bin/sh", "sh", "-c", g_hook, (char *)NULL);
        _exit(127);
    }
    return pid;
}

static void *sampler_main(void *arg)
{
    sampler *s = arg;
    sleep_until_rt(s->r->t0);
    int64_t a = rt_ns();
    sample(s->c0);
    if (s->r->bridge) proc_reset_hwm(g_bridge_pid);
    if (g_hook && !atomic_load(&g_stop)) g_hook_pid = hook_start(s->r);
    sleep_until_rt(s->r->t1);
    sample(s->c1);
    s->wall_s = (rt_ns() - a) / 1e9;
    if (g_hook_pid > 0) { /* bounded: the hook runs for the window; SIGTERM after 30 s more */
        int64_t deadline = fxt_now_ms() + 30000;
        while (waitpid(g_hook_pid, NULL, WNOHANG) == 0) {
            if (fxt_now_ms() > deadline || atomic_load(&g_stop)) {
                kill(g_hook_pid, SIGTERM);
                waitpid(g_hook_pid, NULL, 0);
                break;
            }
            sleep_us(20000);
        }
        g_hook_pid = 0;
    }
    return NULL;
}

static double cpu_pct(sampler *s, int i)
{
    if (s->c0[i] < 0 || s->c1[i] < 0 || s->wall_s <= 0) return -1;
    return (double)(s->c1[i] - s->c0[i]) / (double)sysconf(_SC_CLK_TCK) / s->wall_s * 100.0;
}

static int g_dur_s = 5, g_warm_ms = 1000, g_drain_ms = 15000, g_npubs = 4;
static long long g_window = 10000;
/* -M: every bridge publish (rows 4*, 5, 5n) carries a unique Nats-Msg-Id header, so the bridge's
 * dedup (channel duplicate_window) looks up and records each one: the cost of dedup. */
static bool g_msgid;
static atomic_uint_fast64_t g_msgid_ctr;

/* A bridge publish (rep NULL: with reply subject `reply`) or request (rep set); with -M a
 * Nats-Msg-Id header. */
static natsStatus bridge_send(natsConnection *nc, const char *reply, const char *payload, int len,
                              natsMsg **rep)
{
    if (!g_msgid)
        return rep ? natsConnection_Request(rep, nc, "bench.x", payload, len, 5000)
                   : natsConnection_PublishRequest(nc, "bench.x", reply, payload, len);
    natsMsg *m = NULL;
    natsStatus s = natsMsg_Create(&m, "bench.x", rep ? NULL : reply, payload, len);
    char id[32];
    snprintf(id, sizeof id, "nb-%" PRIu64, (uint64_t)atomic_fetch_add(&g_msgid_ctr, 1));
    if (s == NATS_OK) s = natsMsgHeader_Set(m, "Nats-Msg-Id", id);
    if (s == NATS_OK) s = rep ? natsConnection_RequestMsg(rep, nc, m, 5000) : natsConnection_PublishMsg(nc, m);
    natsMsg_Destroy(m);
    return s;
}

/* ---- soak mode (-S): bridge memory under sustained load ------------------------------------- */

#define SOAK_INTERVAL_S 10
#define SOAK_MIN_S 20
#define SOAK_RSS_LIMIT_MIB 64.0
#define SOAK_GROWTH_FACTOR 1.10
#define SOAK_GROWTH_SLACK_MIB 2.0
#define SOAK_ETCD_ARGS "--auto-compaction-mode=periodic --auto-compaction-retention=1m"

typedef struct soak_sample {
    double t_s;            /* elapsed since the window start */
    long rss_kib, hwm_kib; /* bridge VmRSS / VmHWM (-1: unavailable) */
} soak_sample;

typedef struct soak_mon {
    row *r;
    pthread_t th;
    soak_sample *s;
    int n, cap;
} soak_mon;

static int g_soak_s; /* 0: normal mode */
static soak_mon *g_soak;

static void fmt_mib(char *o, size_t n, double bytes) { bytes < 0 ? snprintf(o, n, "-") : snprintf(o, n, "%.1f", bytes / 1048576.0); }

/* One table row per SOAK_INTERVAL_S of the window (the last one may be shorter), on stdout. */
static void *soak_main(void *arg)
{
    soak_mon *m = arg;
    row *r = m->r;
    sleep_until_rt(r->t0);
    if (atomic_load(&g_stop) || atomic_load(&g_row_over)) return NULL;
    int64_t prev_t = rt_ns();
    long long prev_consumed = atomic_load(&r->consumed);
    int64_t prev_ticks = proc_cpu_ticks(g_bridge_pid);
    for (int k = 1;; k++) {
        int64_t target = r->t0 + (int64_t)k * SOAK_INTERVAL_S * 1000000000LL;
        if (target > r->t1) target = r->t1;
        sleep_until_rt(target);
        if (atomic_load(&g_stop) || atomic_load(&g_row_over)) break;
        int64_t now = rt_ns();
        long long consumed = atomic_load(&r->consumed), published = atomic_load(&r->published);
        int64_t ticks = proc_cpu_ticks(g_bridge_pid);
        soak_sample smp = {.t_s = (now - r->t0) / 1e9,
                           .rss_kib = proc_status_kib(g_bridge_pid, "VmRSS:"),
                           .hwm_kib = proc_hwm_kib(g_bridge_pid)};
        double db = etcd_metric("etcd_mvcc_db_total_size_in_bytes");
        double db_use = etcd_metric("etcd_mvcc_db_total_size_in_use_in_bytes");
        double dt = (now - prev_t) / 1e9;
        double cpu = ticks >= 0 && prev_ticks >= 0 && dt > 0
                         ? (double)(ticks - prev_ticks) / (double)sysconf(_SC_CLK_TCK) / dt * 100.0
                         : -1;
        if (m->n == m->cap) {
            int nc = m->cap ? m->cap * 2 : 64;
            soak_sample *ns = realloc(m->s, (size_t)nc * sizeof *ns);
            if (ns) {
                m->s = ns;
                m->cap = nc;
            }
        }
        if (m->n < m->cap) m->s[m->n++] = smp;
        char rss[16], hwm[16], cp[16], dbs[16], dbu[16];
        fmt_mib(rss, sizeof rss, smp.rss_kib < 0 ? -1 : smp.rss_kib * 1024.0);
        fmt_mib(hwm, sizeof hwm, smp.hwm_kib < 0 ? -1 : smp.hwm_kib * 1024.0);
        cpu >= 0 ? snprintf(cp, sizeof cp, "%.0f", cpu) : snprintf(cp, sizeof cp, "-");
        fmt_mib(dbs, sizeof dbs, db);
        fmt_mib(dbu, sizeof dbu, db_use);
        printf("| %.0f | %.0f | %s | %s | %s | %s / %s | %lld |\n", smp.t_s,
               dt > 0 ? (double)(consumed - prev_consumed) / dt : 0.0, rss, hwm, cp, dbs, dbu,
               published - consumed);
        fflush(stdout);
        prev_t = now;
        prev_consumed = consumed;
        prev_ticks = ticks;
        if (target >= r->t1) break;
    }
    return NULL;
}

/* Index of the last sample taken at or before t_s (-1: none). */
static int soak_at(const soak_mon *m, double t_s)
{
    int idx = -1;
    for (int i = 0; i < m->n; i++)
        if (m->s[i].t_s <= t_s + 0.5) idx = i;
    return idx;
}

/* Summary and verdict; returns the exit code (0 PASS, 1 FAIL, 130 interrupted). */
static int soak_report(soak_mon *m, row *r, bool interrupted, bool bridge_alive)
{
    long long counted = atomic_load(&r->counted), published = atomic_load(&r->published),
              consumed = atomic_load(&r->consumed);
    double win_s = g_soak_s, rate = r->rate;
    if (interrupted) { /* the window was cut short: rate over the part that ran */
        win_s = (atomic_load(&r->last_counted) - r->t0) / 1e9;
        rate = win_s > 0 ? counted / win_s : 0;
    }
    printf("\n- messages: %lld published and consumed in the %.0f s window (%lld published, %lld "
           "deliveries in all, warm-up and drain included); mean %.0f msgs/s; bridge CPU %.0f%%, "
           "etcd CPU %.0f%% (mean over the window)\n",
           counted, win_s, published, consumed, rate, r->bridge_cpu, r->etcd_cpu);
    if (consumed > published)
        printf("- redeliveries (deliveries beyond published): %lld\n", consumed - published);
    double peak = r->rss_kib >= 0 ? r->rss_kib / 1024.0 : -1;
    for (int i = 0; i < m->n; i++) {
        double v = m->s[i].hwm_kib >= 0 ? m->s[i].hwm_kib / 1024.0 : -1;
        if (v > peak) peak = v;
    }
    /* Reference: end of the first minute; the last minute: samples after g_soak_s - 60. A soak
     * under 120 s has no separate minutes: reference at half the soak, compared with the rest. */
    double ref_t = g_soak_s >= 120 ? 60 : (double)(g_soak_s / 2 / SOAK_INTERVAL_S * SOAK_INTERVAL_S);
    double last_from = g_soak_s >= 120 ? g_soak_s - 60.0 : ref_t;
    int ri = soak_at(m, ref_t);
    double ref = ri >= 0 && m->s[ri].rss_kib >= 0 ? m->s[ri].rss_kib / 1024.0 : -1, last_max = -1;
    int nlast = 0;
    for (int i = 0; i < m->n; i++) {
        if (m->s[i].t_s <= last_from + 0.5) continue;
        nlast++;
        double v = m->s[i].rss_kib >= 0 ? m->s[i].rss_kib / 1024.0 : -1;
        if (v > last_max) last_max = v;
    }
    char peaks[16];
    peak >= 0 ? snprintf(peaks, sizeof peaks, "%.1f", peak) : snprintf(peaks, sizeof peaks, "-");
    printf("- bridge peak RSS (VmHWM since the window start, drain included): %s MiB\n", peaks);
    if (ref >= 0 && last_max >= 0)
        printf("- bridge RSS at %.0f s%s: %.1f MiB; max over (%.0f, %d] s%s: %.1f MiB; growth %+.1f MiB "
               "(%+.1f%%)\n",
               ref_t, g_soak_s >= 120 ? " (end of the first minute)" : " (half the soak)", ref, last_from,
               g_soak_s, g_soak_s >= 120 ? " (the last minute)" : "", last_max, last_max - ref,
               ref > 0 ? (last_max - ref) / ref * 100.0 : 0.0);
    printf("- rule: PASS when peak RSS < %.0f MiB and last-minute max RSS <= first-minute-end RSS * %.2f "
           "+ %.0f MiB (soaks under 120 s: RSS at half the soak vs the max after it), with no lost or "
           "errored message\n",
           SOAK_RSS_LIMIT_MIB, SOAK_GROWTH_FACTOR, SOAK_GROWTH_SLACK_MIB);
    if (interrupted) {
        printf("soak: INCOMPLETE (interrupted after %.0f s)\n", m->n ? m->s[m->n - 1].t_s : 0.0);
        fflush(stdout);
        return 130;
    }
    char why[512] = "";
    size_t w = 0;
#define WHY(...)                                                                                        \
    do {                                                                                                \
        if (w < sizeof why)                                                                             \
            w += (size_t)snprintf(why + w, sizeof why - w, "%s", w ? "; " : "");                        \
        if (w < sizeof why) w += (size_t)snprintf(why + w, sizeof why - w, __VA_ARGS__);                \
    } while (0)
    if (r->err[0]) WHY("%s", r->err);
    if (!bridge_alive) WHY("bridge is not running at the end");
    if (peak < 0) WHY("no bridge RSS reading");
    else if (peak >= SOAK_RSS_LIMIT_MIB) WHY("peak RSS %.1f MiB >= %.0f MiB", peak, SOAK_RSS_LIMIT_MIB);
    if (ref < 0 || nlast == 0 || last_max < 0) WHY("not enough RSS samples (%d)", m->n);
    else if (last_max > ref * SOAK_GROWTH_FACTOR + SOAK_GROWTH_SLACK_MIB)
        WHY("RSS grew from %.1f to %.1f MiB (limit %.1f MiB)", ref, last_max,
            ref * SOAK_GROWTH_FACTOR + SOAK_GROWTH_SLACK_MIB);
#undef WHY
    if (why[0]) printf("soak: FAIL (%s)\n", why);
    else printf("soak: PASS\n");
    fflush(stdout);
    return why[0] ? 1 : 0;
}

static natsConnection *connect_nc(row *r, const char *name)
{
    natsOptions *o = NULL;
    natsConnection *nc = NULL;
    natsOptions_Create(&o);
    natsOptions_SetURL(o, g_nats_url);
    natsOptions_SetName(o, name);
    natsOptions_SetMaxReconnect(o, 0);
    natsStatus s = natsConnection_Connect(&nc, o);
    natsOptions_Destroy(o);
    if (s != NATS_OK) {
        row_err(r, "connect: %s", natsStatus_GetText(s));
        return NULL;
    }
    return nc;
}

static void close_nc(natsConnection *nc)
{
    if (!nc) return;
    natsConnection_Close(nc);
    natsConnection_Destroy(nc);
}

static void end_sub(natsSubscription *sub)
{
    if (!sub) return;
    if (natsSubscription_Drain(sub) == NATS_OK) natsSubscription_WaitForDrainCompletion(sub, 3000);
    natsSubscription_Destroy(sub);
}

/* ---- 1: NATS core --------------------------------------------------------------------------- */

static void core_cb(natsConnection *nc, natsSubscription *sub, natsMsg *m, void *arg)
{
    (void)nc, (void)sub;
    on_consumed(arg, natsMsg_GetData(m), natsMsg_GetDataLength(m));
    natsMsg_Destroy(m);
}

static void run_core(row *r, char *payload)
{
    r->has_e2e = true;
    natsConnection *pc = connect_nc(r, "nb-core-pub"), *sc = connect_nc(r, "nb-core-sub");
    natsSubscription *sub = NULL;
    char subj[64];
    snprintf(subj, sizeof subj, "nbcore.%zu", r->size);
    if (pc && sc && natsConnection_Subscribe(&sub, sc, subj, core_cb, r) == NATS_OK) {
        natsSubscription_SetPendingLimits(sub, -1, -1);
        natsConnection_Flush(sc);
        while (pub_gate(r, g_window, false)) {
            stamp(r, payload);
            natsStatus s = natsConnection_Publish(pc, subj, payload, (int)r->size);
            if (s != NATS_OK) {
                row_err(r, "publish: %s", natsStatus_GetText(s));
                break;
            }
            atomic_fetch_add(&r->published, 1);
        }
        natsConnection_FlushTimeout(pc, 5000);
        drain(r, true, false, g_drain_ms);
    } else if (!r->err[0]) {
        row_err(r, "subscribe failed");
    }
    end_sub(sub);
    close_nc(pc);
    close_nc(sc);
}

/* ---- 2, 3: JetStream ------------------------------------------------------------------------ */

static void js_ack_cb(jsCtx *js, natsMsg *m, jsPubAck *pa, jsPubAckErr *pae, void *arg)
{
    (void)js;
    row *r = arg;
    if (pa && !pae) {
        const char *d = natsMsg_GetData(m);
        if (d && natsMsg_GetDataLength(m) >= 16) {
            int64_t t;
            memcpy(&t, d, 8);
            if (t >= r->t0 && t < r->t1) hist_add(&r->pack, rt_ns() - t);
        }
        atomic_fetch_add(&r->pub_acked, 1);
    } else {
        atomic_fetch_add(&r->errors, 1);
    }
    natsMsg_Destroy(m);
}

static int make_stream(row *r, jsCtx *js, const char *name, const char *subj)
{
    jsErrCode jerr = 0;
    js_DeleteStream(js, name, NULL, &jerr); /* leftover from an earlier row: ignore errors */
    jsStreamConfig sc;
    jsStreamConfig_Init(&sc);
    sc.Name = name;
    const char *subjects[1] = {subj};
    sc.Subjects = subjects;
    sc.SubjectsLen = 1;
    sc.Retention = js_WorkQueuePolicy;
    sc.Storage = js_FileStorage;
    sc.Replicas = 1;
    jsStreamInfo *si = NULL;
    natsStatus s = js_AddStream(&si, js, &sc, NULL, &jerr);
    if (s != NATS_OK) {
        row_err(r, "js_AddStream: %s (jerr %d)", natsStatus_GetText(s), (int)jerr);
        return -1;
    }
    jsStreamInfo_Destroy(si);
    return 0;
}

typedef struct pull_ctx {
    row *r;
    natsSubscription *sub;
    atomic_bool stop;
} pull_ctx;

static void *pull_main(void *arg)
{
    pull_ctx *c = arg;
    while (!atomic_load(&c->stop)) {
        natsMsgList list = {0};
        jsErrCode jerr = 0;
        natsStatus s = natsSubscription_Fetch(&list, c->sub, 100, 200, &jerr);
        if (s == NATS_OK) {
            for (int i = 0; i < list.Count; i++) {
                natsMsg *m = list.Msgs[i];
                on_consumed(c->r, natsMsg_GetData(m), natsMsg_GetDataLength(m));
                natsMsg_Ack(m, NULL);
            }
        } else if (s != NATS_TIMEOUT) {
            sleep_us(10000);
        }
        natsMsgList_Destroy(&list);
    }
    nats_ReleaseThreadMemory();
    return NULL;
}

static void run_js_async(row *r, char *payload)
{
    r->has_e2e = r->has_pack = true;
    natsConnection *pc = connect_nc(r, "nb-js-pub"), *sc = connect_nc(r, "nb-js-sub");
    jsCtx *pjs = NULL, *sjs = NULL;
    natsSubscription *sub = NULL;
    char stream[32], subj[64];
    snprintf(stream, sizeof stream, "NBWQ_%zu", r->size);
    snprintf(subj, sizeof subj, "nbjs.%zu", r->size);
    if (!pc || !sc) goto out;
    jsOptions jo;
    jsOptions_Init(&jo);
    jo.PublishAsync.MaxPending = PUB_WINDOW;
    jo.PublishAsync.AckHandler = js_ack_cb;
    jo.PublishAsync.AckHandlerClosure = r;
    jo.PublishAsync.StallWait = 5000;
    if (natsConnection_JetStream(&pjs, pc, &jo) != NATS_OK || natsConnection_JetStream(&sjs, sc, NULL) != NATS_OK) {
        row_err(r, "JetStream context failed");
        goto out;
    }
    if (make_stream(r, sjs, stream, subj) != 0) goto out;
    jsSubOptions so;
    jsSubOptions_Init(&so);
    so.Config.MaxAckPending = 5000;
    so.Config.AckPolicy = js_AckExplicit;
    jsErrCode jerr = 0;
    natsStatus s = js_PullSubscribe(&sub, sjs, subj, "nbpull", NULL, &so, &jerr);
    if (s != NATS_OK) {
        row_err(r, "js_PullSubscribe: %s (jerr %d)", natsStatus_GetText(s), (int)jerr);
        goto out;
    }
    pull_ctx pctx = {.r = r, .sub = sub};
    pthread_t th;
    pthread_create(&th, NULL, pull_main, &pctx);
    while (pub_gate(r, g_window, true)) {
        stamp(r, payload);
        s = js_PublishAsync(pjs, subj, payload, (int)r->size, NULL);
        if (s != NATS_OK) {
            row_err(r, "js_PublishAsync: %s", natsStatus_GetText(s));
            break;
        }
        atomic_fetch_add(&r->published, 1);
    }
    drain(r, true, true, g_drain_ms);
    atomic_store(&pctx.stop, true);
    pthread_join(th, NULL);
    if (atomic_load(&r->errors)) row_err(r, "%lld async publish errors", (long long)atomic_load(&r->errors));
out:
    if (sub) {
        natsSubscription_Unsubscribe(sub);
        natsSubscription_Destroy(sub);
    }
    if (sjs) {
        jsErrCode je = 0;
        js_DeleteStream(sjs, stream, NULL, &je);
    }
    if (pjs) {
        jsPubOptions po;
        jsPubOptions_Init(&po);
        po.MaxWait = 2000;
        js_PublishAsyncComplete(pjs, &po);
        jsCtx_Destroy(pjs);
    }
    if (sjs) jsCtx_Destroy(sjs);
    close_nc(pc);
    close_nc(sc);
}

static void run_js_sync(row *r, char *payload)
{
    r->has_pack = true;
    natsConnection *pc = connect_nc(r, "nb-js-sync");
    jsCtx *js = NULL;
    char stream[32], subj[64];
    snprintf(stream, sizeof stream, "NBSYNC_%zu", r->size);
    snprintf(subj, sizeof subj, "nbsync.%zu", r->size);
    if (!pc) return;
    if (natsConnection_JetStream(&js, pc, NULL) != NATS_OK) {
        row_err(r, "JetStream context failed");
        goto out;
    }
    if (make_stream(r, js, stream, subj) != 0) goto out;
    jsPubOptions po;
    jsPubOptions_Init(&po);
    po.MaxWait = 5000;
    while (!atomic_load(&g_stop)) {
        int64_t t = rt_ns();
        if (t >= r->t1) break;
        stamp(r, payload);
        jsPubAck *pa = NULL;
        jsErrCode jerr = 0;
        natsStatus s = js_Publish(&pa, js, subj, payload, (int)r->size, &po, &jerr);
        int64_t e = rt_ns();
        jsPubAck_Destroy(pa);
        atomic_fetch_add(&r->published, 1);
        if (s != NATS_OK) {
            row_err(r, "js_Publish: %s (jerr %d)", natsStatus_GetText(s), (int)jerr);
            break;
        }
        if (t >= r->t0) {
            hist_add(&r->pack, e - t);
            atomic_fetch_add(&r->counted, 1);
        }
    }
out:
    if (js) {
        jsErrCode je = 0;
        js_DeleteStream(js, stream, NULL, &je);
        jsCtx_Destroy(js);
    }
    close_nc(pc);
}

/* ---- 4, 5: fluxon-bridge -------------------------------------------------------------------- */

static void bridge_consumer_cb(natsConnection *nc, natsSubscription *sub, natsMsg *m, void *arg)
{
    (void)sub;
    row *r = arg;
    on_consumed(r, natsMsg_GetData(m), natsMsg_GetDataLength(m));
    const char *reply = natsMsg_GetReply(m);
    if (reply && *reply) natsConnection_Publish(nc, reply, "+ACK", 4);
    natsMsg_Destroy(m);
}

/* PubAck on "_INBOX.nb.<row>.<pub>.<publish ns>". */
static void puback_cb(natsConnection *nc, natsSubscription *sub, natsMsg *m, void *arg)
{
    (void)nc, (void)sub;
    row *r = arg;
    const char *subj = natsMsg_GetSubject(m), *dot = strrchr(subj, '.');
    const char *d = natsMsg_GetData(m);
    int n = natsMsg_GetDataLength(m);
    bool ok = d && n > 0 && d[0] == '{' && !memmem(d, (size_t)n, "\"error\"", 7);
    if (ok) {
        int64_t t = dot ? strtoll(dot + 1, NULL, 10) : 0;
        if (t >= r->t0 && t < r->t1) hist_add(&r->pack, rt_ns() - t);
        atomic_fetch_add(&r->pub_acked, 1);
    } else {
        static atomic_int shown;
        if (atomic_fetch_add(&shown, 1) < 3) logf_("error PubAck: %.*s", n > 200 ? 200 : n, d ? d : "");
        atomic_fetch_add(&r->errors, 1);
    }
    natsMsg_Destroy(m);
}

typedef struct bpub {
    row *r;
    int idx;
    natsConnection *nc;
    natsSubscription *sub;
    char prefix[64];
    size_t size;
    pthread_t th;
} bpub;

static void *bpub_main(void *arg)
{
    bpub *p = arg;
    char *payload = calloc(1, p->size);
    char reply[128];
    memset(payload + 16, 'x', p->size - 16);
    while (payload && pub_gate(p->r, g_window, true)) {
        stamp(p->r, payload);
        int64_t t;
        memcpy(&t, payload, 8);
        snprintf(reply, sizeof reply, "%s.%" PRId64, p->prefix, t);
        natsStatus s = bridge_send(p->nc, reply, payload, (int)p->size, NULL);
        if (s != NATS_OK) {
            row_err(p->r, "publish: %s", natsStatus_GetText(s));
            break;
        }
        atomic_fetch_add(&p->r->published, 1);
    }
    natsConnection_FlushTimeout(p->nc, 5000);
    free(payload);
    nats_ReleaseThreadMemory();
    return NULL;
}

static void run_bridge(row *r, int npubs, int nnames, bool serial, char *payload)
{
    r->has_e2e = nnames > 0; /* 5n drains after the window: no e2e latency */
    r->has_pack = r->bridge = true;
    natsConnection *cnc[MAX_NAMES] = {0};
    natsSubscription *csub[MAX_NAMES] = {0};
    bpub pubs[MAX_PUBS];
    memset(pubs, 0, sizeof pubs);
    int started = 0;
    for (int i = 0; i < nnames; i++) {
        char name[32], subj[64];
        snprintf(name, sizeof name, "nb-consumer-c%d", i + 1);
        snprintf(subj, sizeof subj, "q.bench.c%d", i + 1);
        if (!(cnc[i] = connect_nc(r, name))) goto out;
        if (natsConnection_Subscribe(&csub[i], cnc[i], subj, bridge_consumer_cb, r) != NATS_OK) {
            row_err(r, "subscribe %s failed", subj);
            goto out;
        }
        natsSubscription_SetPendingLimits(csub[i], -1, -1);
        natsConnection_Flush(cnc[i]);
    }
    if (serial) {
        natsConnection *nc = connect_nc(r, "nb-bridge-req");
        if (!nc) goto out;
        while (!atomic_load(&g_stop)) {
            int64_t t = rt_ns();
            if (t >= r->t1) break;
            stamp(r, payload);
            natsMsg *rep = NULL;
            natsStatus s = bridge_send(nc, NULL, payload, (int)r->size, &rep);
            int64_t e = rt_ns();
            if (s != NATS_OK) {
                row_err(r, "request: %s", natsStatus_GetText(s));
                break;
            }
            atomic_fetch_add(&r->published, 1);
            const char *d = natsMsg_GetData(rep);
            int n = natsMsg_GetDataLength(rep);
            if (!d || n <= 0 || d[0] != '{' || memmem(d, (size_t)n, "\"error\"", 7)) {
                row_err(r, "error PubAck: %.*s", n > 120 ? 120 : n, d ? d : "");
                natsMsg_Destroy(rep);
                break;
            }
            natsMsg_Destroy(rep);
            atomic_fetch_add(&r->pub_acked, 1);
            if (t >= r->t0) {
                hist_add(&r->pack, e - t);
                atomic_fetch_add(&r->serial_acked, 1);
            }
        }
        close_nc(nc);
        if (nnames == 0) { /* 5n: nobody consumed while measuring (as row 3); drain now, untimed */
            if (!(cnc[0] = connect_nc(r, "nb-consumer-c1"))) goto out;
            if (natsConnection_Subscribe(&csub[0], cnc[0], "q.bench.c1", bridge_consumer_cb, r) !=
                NATS_OK) {
                row_err(r, "subscribe q.bench.c1 failed");
                goto out;
            }
            natsSubscription_SetPendingLimits(csub[0], -1, -1);
            natsConnection_Flush(cnc[0]);
        }
        drain(r, true, false, g_drain_ms);
        goto out;
    }
    for (int i = 0; i < npubs; i++) {
        bpub *p = &pubs[i];
        char name[32], wild[80];
        p->r = r;
        p->idx = i;
        p->size = r->size;
        snprintf(name, sizeof name, "nb-publisher-%d", i);
        snprintf(p->prefix, sizeof p->prefix, "_INBOX.nb.%" PRIu64 ".%d", r->id, i);
        snprintf(wild, sizeof wild, "%s.*", p->prefix);
        if (!(p->nc = connect_nc(r, name))) goto out;
        if (natsConnection_Subscribe(&p->sub, p->nc, wild, puback_cb, r) != NATS_OK) {
            row_err(r, "subscribe %s failed", wild);
            goto out;
        }
        natsSubscription_SetPendingLimits(p->sub, -1, -1);
        natsConnection_Flush(p->nc);
    }
    for (int i = 0; i < npubs; i++) {
        pthread_create(&pubs[i].th, NULL, bpub_main, &pubs[i]);
        started++;
    }
    for (int i = 0; i < started; i++) pthread_join(pubs[i].th, NULL);
    started = 0;
    drain(r, true, true, g_drain_ms);
    if (atomic_load(&r->errors)) row_err(r, "%lld error PubAcks", (long long)atomic_load(&r->errors));
out:
    for (int i = 0; i < started; i++) pthread_join(pubs[i].th, NULL);
    for (int i = 0; i < npubs; i++) {
        end_sub(pubs[i].sub);
        close_nc(pubs[i].nc);
    }
    for (int i = 0; i < (nnames ? nnames : 1); i++) { /* 5n opens c1 only to drain */
        end_sub(csub[i]);
        close_nc(cnc[i]);
    }
}

/* ---- driver ------------------------------------------------------------------------------- */

/* Row isolation: the consumers of the previous bridge row have unsubscribed, but the bridge keeps
 * their claims (and the sub-MPSCs they hold stay ready, so the producer keeps routing into them)
 * until release_after without interest. A row that started now would send most of its messages
 * to sub-MPSCs nobody delivers from, and they would wait for the release plus the adoption of the
 * stranded backlog (seconds of e2e latency at low rates, row 5). Wait until no claim is live,
 * plus a short settle for the release (ready key delete) to reach etcd and the producer's watch. */
static void wait_claims_released(row *r)
{
    int64_t deadline = fxt_now_ms() + BENCH_RELEASE_MS + 5000, t0 = fxt_now_ms();
    while (!atomic_load(&g_stop)) {
        double n = bridge_metric_sum("fluxon_claims");
        if (n == 0) {
            sleep_us(300000);
            logf_("  previous claims released after %" PRId64 " ms", fxt_now_ms() - t0);
            return;
        }
        if (fxt_now_ms() > deadline) {
            row_err(r, "claims of the previous row not released (%.0f live)", n);
            return;
        }
        sleep_us(50000);
    }
}

static void run_row(row *r)
{
    static uint64_t seq;
    r->id = ((uint64_t)getpid() << 32) | ++seq;
    pthread_mutex_init(&r->e2e.mu, NULL);
    pthread_mutex_init(&r->pack.mu, NULL);
    char *payload = calloc(1, r->size);
    memset(payload + 16, 'x', r->size - 16);
    logf_("row %s %s, %zu B", r->scen, r->desc, r->size);
    snprintf(g_row_label, sizeof g_row_label, "row %s (%s), %zu B, plane %s\n", r->scen, r->desc,
             r->size, g_plane);
    if (r->bridge && !child_alive(g_bridge_pid)) {
        row_err(r, "bridge is not running");
        free(payload);
        return;
    }
    if (r->bridge) wait_claims_released(r);
    double req0 = r->bridge ? bridge_etcd_requests() : -1;
    if (g_px) px_snap(r->px0);
    r->t0 = rt_ns() + (int64_t)g_warm_ms * 1000000;
    r->t1 = r->t0 + (int64_t)g_dur_s * 1000000000;
    sampler smp = {.r = r};
    pthread_create(&smp.th, NULL, sampler_main, &smp);
    if (g_soak) {
        g_soak->r = r;
        pthread_create(&g_soak->th, NULL, soak_main, g_soak);
    }
    if (!strcmp(r->scen, "1")) run_core(r, payload);
    else if (!strcmp(r->scen, "2")) run_js_async(r, payload);
    else if (!strcmp(r->scen, "3")) run_js_sync(r, payload);
    else if (!strcmp(r->scen, "4a")) run_bridge(r, 1, 1, false, payload);
    else if (!strcmp(r->scen, "4b")) run_bridge(r, 1, 4, false, payload);
    else if (!strcmp(r->scen, "4c")) run_bridge(r, g_npubs, 4, false, payload);
    else if (!strcmp(r->scen, "5")) run_bridge(r, 0, 1, true, payload);
    else if (!strcmp(r->scen, "5n")) run_bridge(r, 0, 0, true, payload);
    if (rt_ns() < r->t1 && !atomic_load(&g_stop) && !r->err[0]) row_err(r, "ended before the window");
    if (g_soak && rt_ns() < r->t1) atomic_store(&g_row_over, true); /* don't idle out the soak */
    sleep_until_rt(r->t1);
    pthread_join(smp.th, NULL);
    if (g_soak) pthread_join(g_soak->th, NULL);
    free(payload);
    double win = g_dur_s;
    long long counted = atomic_load(&r->counted);
    if (r->has_e2e) {
        double last = (atomic_load(&r->last_counted) - r->t0) / 1e9;
        if (last > win) win = last;
    }
    r->rate = counted / win;
    if (!strcmp(r->scen, "5") || !strcmp(r->scen, "5n"))
        r->rate = (double)atomic_load(&r->serial_acked) / g_dur_s;
    r->mbs = r->rate * (double)r->size / 1e6;
    r->bridge_cpu = r->bridge ? cpu_pct(&smp, 0) : -1;
    r->etcd_cpu = r->bridge ? cpu_pct(&smp, 1) : -1;
    r->nats_cpu = cpu_pct(&smp, 2);
    r->client_cpu = cpu_pct(&smp, 3);
    r->redis_cpu = cpu_pct(&smp, 4);
    r->rss_kib = r->bridge ? proc_hwm_kib(g_bridge_pid) : -1;
    if (g_px) px_snap(r->px1);
    r->req_per_msg = -1;
    if (r->bridge) {
        double req1 = bridge_etcd_requests();
        long long c = atomic_load(&r->consumed);
        if (req0 >= 0 && req1 >= 0 && c > 0) r->req_per_msg = (req1 - req0) / (double)c;
    }
    if (counted == 0 && !r->err[0] && !atomic_load(&g_stop)) row_err(r, "no message counted");
    logf_("  -> %.0f msgs/s (%lld counted, %lld published, %lld consumed)%s%s", r->rate, counted,
          (long long)atomic_load(&r->published), (long long)atomic_load(&r->consumed),
          r->err[0] ? "; ERROR: " : "", r->err);
}

static void fmt_ms(char *o, size_t n, double v) { v < 0 ? snprintf(o, n, "-") : snprintf(o, n, "%.2f", v); }

static void print_row(row *r)
{
    char e50[16], e99[16], e999[16], p50[16], p99[16], rss[16], bc[16], ec[16], nc[16], cc[16],
        rq[16];
    fmt_ms(e50, 16, r->has_e2e ? hist_pct_ms(&r->e2e, 0.50) : -1);
    fmt_ms(e99, 16, r->has_e2e ? hist_pct_ms(&r->e2e, 0.99) : -1);
    fmt_ms(e999, 16, r->has_e2e ? hist_pct_ms(&r->e2e, 0.999) : -1);
    fmt_ms(p50, 16, r->has_pack ? hist_pct_ms(&r->pack, 0.50) : -1);
    fmt_ms(p99, 16, r->has_pack ? hist_pct_ms(&r->pack, 0.99) : -1);
    r->rss_kib >= 0 ? snprintf(rss, 16, "%.1f", r->rss_kib / 1024.0) : snprintf(rss, 16, "-");
    r->bridge_cpu >= 0 ? snprintf(bc, 16, "%.0f", r->bridge_cpu) : snprintf(bc, 16, "-");
    r->etcd_cpu >= 0 ? snprintf(ec, 16, "%.0f", r->etcd_cpu) : snprintf(ec, 16, "-");
    r->nats_cpu >= 0 ? snprintf(nc, 16, "%.0f", r->nats_cpu) : snprintf(nc, 16, "-");
    r->client_cpu >= 0 ? snprintf(cc, 16, "%.0f", r->client_cpu) : snprintf(cc, 16, "-");
    r->req_per_msg >= 0 ? snprintf(rq, 16, "%.2f", r->req_per_msg) : snprintf(rq, 16, "-");
    char szs[32];
    if (r->size == 4096) snprintf(szs, sizeof szs, "4 KiB");
    else snprintf(szs, sizeof szs, "%zu B", r->size);
    printf("| %s | %s | %s | %.0f | %.2f | %s / %s / %s | %s / %s | %s | %s | %s | %s | %s | %s | %s |\n",
           r->scen, r->desc, szs, r->rate, r->mbs, e50, e99, e999, p50, p99, rss, bc, ec, nc, cc,
           rq, r->err[0] ? r->err : "");
}

static void size_str(char *o, size_t n, size_t size)
{
    if (size == 4096) snprintf(o, n, "4 KiB");
    else snprintf(o, n, "%zu B", size);
}

/* CPU microseconds per message: CPU% / msgs/s (both over the measured window). */
static void fmt_us(char *o, size_t n, double pct, double rate)
{
    if (pct < 0 || rate <= 0) snprintf(o, n, "-");
    else snprintf(o, n, "%.1f", pct / 100.0 * 1e6 / rate);
}

static void print_cpu_table(row **rows, int nrows)
{
    printf("CPU per message (us of CPU time per message, over the measured window: CPU%% / msgs/s; "
           "client = this program)\n\n");
    printf("| # | size | msgs/s | bridge us/msg | etcd us/msg | nats-server us/msg | redis us/msg | "
           "client us/msg | total us/msg |\n");
    printf("|---|---|---|---|---|---|---|---|---|\n");
    for (int i = 0; i < nrows; i++) {
        row *r = rows[i];
        char sz[16], b[16], e[16], n[16], rd[16], c[16], t[16];
        size_str(sz, sizeof sz, r->size);
        fmt_us(b, 16, r->bridge_cpu, r->rate);
        fmt_us(e, 16, r->etcd_cpu, r->rate);
        fmt_us(n, 16, r->nats_cpu, r->rate);
        fmt_us(rd, 16, r->redis_cpu, r->rate);
        fmt_us(c, 16, r->client_cpu, r->rate);
        double tot = 0;
        const double parts[] = {r->bridge_cpu, r->etcd_cpu, r->nats_cpu, r->redis_cpu, r->client_cpu};
        for (int k = 0; k < 5; k++)
            if (parts[k] > 0) tot += parts[k];
        fmt_us(t, 16, tot, r->rate);
        printf("| %s | %s | %.0f | %s | %s | %s | %s | %s | %s |\n", r->scen, sz, r->rate, b, e, n, rd,
               c, t);
    }
    printf("\n");
}

static void print_kind_table(row **rows, int nrows)
{
    printf("etcd requests per consumed message by kind (-X: counted by a proxy in front of etcd; the "
           "whole row, warm-up and drain included; bytes are HTTP request and answer bytes)\n\n");
    printf("| # | size | kind | req/msg | req B/msg | answer B/msg |\n");
    printf("|---|---|---|---|---|---|\n");
    for (int i = 0; i < nrows; i++) {
        row *r = rows[i];
        long long c = atomic_load(&r->consumed);
        if (!r->bridge || c <= 0) continue;
        char sz[16];
        size_str(sz, sizeof sz, r->size);
        double tr = 0, tq = 0, ta = 0;
        for (int k = 0; k < PK_N; k++) {
            double q = (double)(r->px1[k].reqs - r->px0[k].reqs) / (double)c;
            double qb = (double)(r->px1[k].req_bytes - r->px0[k].req_bytes) / (double)c;
            double ab = (double)(r->px1[k].resp_bytes - r->px0[k].resp_bytes) / (double)c;
            if (q <= 0 && ab <= 0) continue;
            tr += q, tq += qb, ta += ab;
            printf("| %s | %s | %s | %.4f | %.1f | %.1f |\n", r->scen, sz, k_pk_name[k], q, qb, ab);
        }
        printf("| %s | %s | **all** | %.4f | %.1f | %.1f |\n", r->scen, sz, tr, tq, ta);
    }
    printf("\n");
}

static const struct {
    const char *scen, *desc;
} k_scen[] = {
    {"1", "NATS core pub -> async sub"},
    {"2", "JetStream WorkQueue file R1: async pub + pull/ack"},
    {"3", "JetStream js_Publish, one at a time"},
    {"4a", "bridge: 1 pub, 1 name (c1)"},
    {"4b", "bridge: 1 pub, 4 names (c1..c4)"},
    {"4c", "bridge: P pubs, 4 names"},
    {"5", "bridge: request one at a time (+ c1 acking)"},
    {"5n", "bridge: request one at a time, no consumer (as row 3)"},
};
#define N_SCEN (sizeof k_scen / sizeof k_scen[0])

static bool selected(const char *list, const char *scen)
{
    if (!list) return true;
    char tmp[128];
    snprintf(tmp, sizeof tmp, "%s", list);
    for (char *save, *t = strtok_r(tmp, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (!strcmp(t, scen)) return true;
        if (strlen(t) == 1 && scen[0] == t[0]) return true; /* "4" selects 4a..4c */
    }
    return false;
}

static row *find_row(row **rows, int n, const char *scen, size_t size)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(rows[i]->scen, scen) && rows[i]->size == size) return rows[i];
    return NULL;
}

static void usage(void)
{
    fprintf(stderr, "usage: nats_bench [-d seconds] [-w warmup_ms] [-b bridge] [-D drain_ms] [-W window] "
                    "[-P publishers] [-o 1,2,3,4a,4b,4c,5,5n] [-s 128,4096] [-M] [-K etcd|redis-everysec|redis-always]\n"
                    "  -M  bridge publishes carry a unique Nats-Msg-Id (cost of dedup)\n"
                    "  -X  the bridge's etcd through a counting proxy: etcd requests and bytes per message by kind\n"
                    "  -L  nats.leaf_pubacks in the bridge's config (PubAcks over the leaf connection)\n"
                    "  -J  no jetstream.domain key in the bridge's config (bridges older than that key)\n"
                    "  -p 'cmd'  run sh -c cmd at each row's window start (env BRIDGE_PID ETCD_PID NATS_PID\n"
                    "      REDIS_PID BENCH_PID ROW SIZE WINDOW_S); the row waits for it\n"
                    "       nats_bench -S seconds [-s size] [-w warmup_ms] [-b bridge] [-D drain_ms] [-W window]\n"
                    "  -S  soak (at least %d s): scenario 4a's traffic (default 128 B) for that long, a line of\n"
                    "      rate / bridge RSS / CPU / etcd db size every %d s, then the RSS verdict: PASS when\n"
                    "      peak RSS < %.0f MiB and the last minute's max RSS <= RSS at 60 s * %.2f + %.0f MiB\n",
            SOAK_MIN_S, SOAK_INTERVAL_S, SOAK_RSS_LIMIT_MIB, SOAK_GROWTH_FACTOR, SOAK_GROWTH_SLACK_MIB);
    exit(2);
}

int main(int argc, char **argv)
{
    const char *bridge = NULL, *only = NULL, *sizes_arg = NULL;
    bool dur_given = false;
    int c;
    while ((c = getopt(argc, argv, "d:w:b:D:W:P:o:s:S:MK:XJLp:T:h")) != -1) {
        switch (c) {
        case 'd': g_dur_s = atoi(optarg), dur_given = true; break;
        case 'M': g_msgid = true; break;
        case 'X': g_count_kinds = true; break;
        case 'J': g_no_js_domain = true; break;
        case 'L': g_leaf_pubacks = true; break;
        case 'T': g_transport = optarg; break;
        case 'p': g_hook = optarg; break;
        case 'S': g_soak_s = atoi(optarg); if (g_soak_s < SOAK_MIN_S) usage(); break;
        case 'w': g_warm_ms = atoi(optarg); break;
        case 'b': bridge = optarg; break;
        case 'D': g_drain_ms = atoi(optarg); break;
        case 'W': g_window = atoll(optarg); break;
        case 'P': g_npubs = atoi(optarg); break;
        case 'o': only = optarg; break;
        case 'K':
            if (strcmp(optarg, "etcd") && strcmp(optarg, "redis-everysec") && strcmp(optarg, "redis-always"))
                usage();
            g_plane = optarg;
            break;
        case 's': sizes_arg = optarg; break;
        default: usage();
        }
    }
    if (g_dur_s < 1 || g_warm_ms < 0 || g_npubs < 1 || g_npubs > MAX_PUBS || g_drain_ms < 100) usage();
    if (g_count_kinds && !g_transport) g_transport = "json"; /* the counting proxy reads HTTP/1.1 */
    if (g_soak_s && (dur_given || only)) {
        fprintf(stderr, "nats_bench: -S runs scenario 4a for its own duration; -d and -o do not apply\n");
        usage();
    }
    if (!sizes_arg) sizes_arg = g_soak_s ? "128" : "128,4096";
    char bbuf[512];
    if (!bridge) {
        const char *b = getenv("BUILD");
        snprintf(bbuf, sizeof bbuf, "%s/fluxon-bridge", b && *b ? b : "build");
        bridge = bbuf;
    }
    size_t sizes[8];
    int nsizes = 0;
    {
        char tmp[128];
        snprintf(tmp, sizeof tmp, "%s", sizes_arg);
        for (char *save, *t = strtok_r(tmp, ",", &save); t && nsizes < 8; t = strtok_r(NULL, ",", &save)) {
            long v = atol(t);
            if (v < 16 || v > 1000000) usage();
            sizes[nsizes++] = (size_t)v;
        }
        if (nsizes == 0 || (g_soak_s && nsizes != 1)) usage();
    }
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    install_fatal_handlers();
    curl_global_init(CURL_GLOBAL_ALL);
    nats_Open(-1);

    int rc = 0;
    row *rows[64];
    int nrows = 0;
    if (g_soak_s) snprintf(g_etcd.extra_args, sizeof g_etcd.extra_args, "%s", SOAK_ETCD_ARGS);
    /* FX_BENCH_ETCD_ARGS: extra etcd flags for a what-if run (e.g. --unsafe-no-fsync, the
     * durability JetStream's file store has by default); printed in the header. */
    const char *xa = getenv("FX_BENCH_ETCD_ARGS");
    if (xa && *xa) {
        size_t used = strlen(g_etcd.extra_args);
        if (strlen(xa) + used + 2 > sizeof g_etcd.extra_args) {
            logf_("FX_BENCH_ETCD_ARGS too long");
            return 2;
        }
        snprintf(g_etcd.extra_args + used, sizeof g_etcd.extra_args - used, "%s%s",
                 used ? " " : "", xa);
        printf("etcd extra flags: %s\n", g_etcd.extra_args);
    }
    if (start_stack(bridge) != 0) {
        logf_("could not start the stack");
        cleanup_all();
        nats_Close();
        return 1;
    }
    if (g_soak_s) {
        soak_mon mon = {0};
        g_soak = &mon;
        g_dur_s = g_soak_s;
        row *r = calloc(1, sizeof *r);
        snprintf(r->scen, sizeof r->scen, "4a");
        snprintf(r->desc, sizeof r->desc, "bridge: 1 pub, 1 name (c1)");
        r->size = sizes[0];
        r->bridge = true;
        printf("soak: scenario 4a (1 publisher with PubAcks, consumer c1 acking every delivery), %zu B, "
               "%d s after %d ms warm-up; closed loop (max %lld published-not-consumed, max %d publishes "
               "awaiting their ack); a row every %d s; etcd %s; CPU%% = one core (the machine has %ld)\n\n",
               r->size, g_soak_s, g_warm_ms, g_window, PUB_WINDOW, SOAK_INTERVAL_S, SOAK_ETCD_ARGS,
               sysconf(_SC_NPROCESSORS_ONLN));
        printf("| elapsed s | msgs/s | bridge RSS MiB | bridge HWM MiB | bridge CPU%% | etcd db MiB (total / "
               "in use) | published-not-consumed |\n");
        printf("|---|---|---|---|---|---|---|\n");
        fflush(stdout);
        run_row(r);
        bool interrupted = atomic_load(&g_stop);
        rc = soak_report(&mon, r, interrupted, child_alive(g_bridge_pid));
        g_soak = NULL;
        cleanup_all();
        free(mon.s);
        free(r);
        nats_Close();
        curl_global_cleanup();
        return rc;
    }
    for (int si = 0; si < nsizes && !atomic_load(&g_stop); si++) {
        for (size_t k = 0; k < N_SCEN && !atomic_load(&g_stop); k++) {
            if (!selected(only, k_scen[k].scen)) continue;
            row *r = calloc(1, sizeof *r);
            snprintf(r->scen, sizeof r->scen, "%s", k_scen[k].scen);
            if (!strcmp(r->scen, "4c")) snprintf(r->desc, sizeof r->desc, "bridge: %d pubs, 4 names (c1..c4)", g_npubs);
            else snprintf(r->desc, sizeof r->desc, "%s", k_scen[k].desc);
            r->size = sizes[si];
            r->bridge = r->scen[0] == '4' || r->scen[0] == '5';
            run_row(r);
            if (r->err[0]) rc = 1;
            rows[nrows++] = r;
        }
    }

    printf("payload plane: %s\n", !strcmp(g_plane, "etcd") ? "etcd (fused: payload + offset in one txn)"
                                   : !strcmp(g_plane, "redis-everysec") ? "Redis, appendfsync everysec (split)"
                                                                          : "Redis, appendfsync always (split)");
    printf("bridge etcd transport: %s\n", g_transport ? g_transport : "the bridge's default (grpc)");
    printf("window %d s after %d ms warm-up per row; closed loop (max %lld published-not-consumed, max %d "
           "publishes awaiting their ack); CPU%% = one core (the machine has %ld); client = this "
           "program's NATS clients; latencies in ms\n\n",
           g_dur_s, g_warm_ms, g_window, PUB_WINDOW, sysconf(_SC_NPROCESSORS_ONLN));
    printf("| # | scenario | size | msgs/s | MB/s | e2e p50 / p99 / p99.9 | pub-ack p50 / p99 | bridge RSS MiB | "
           "bridge CPU%% | etcd CPU%% | nats-server CPU%% | client CPU%% | etcd req/msg | note |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (int i = 0; i < nrows; i++) print_row(rows[i]);
    printf("| 6 | raw etcd txn rate | | see the etcd_bench table (txn, conc 1 and 8) | | | | | | | | | | |\n\n");
    print_cpu_table(rows, nrows);
    if (g_px) print_kind_table(rows, nrows);
    for (int si = 0; si < nsizes; si++) {
        char sz[32];
        if (sizes[si] == 4096) snprintf(sz, sizeof sz, "4 KiB");
        else snprintf(sz, sizeof sz, "%zu B", sizes[si]);
        row *js = find_row(rows, nrows, "2", sizes[si]), *jsy = find_row(rows, nrows, "3", sizes[si]);
        const char *bs[] = {"4a", "4b", "4c"};
        for (int b = 0; b < 3; b++) {
            row *br = find_row(rows, nrows, bs[b], sizes[si]);
            if (js && br && js->rate > 0)
                printf("- throughput bridge/JetStream, %s: %s vs 2 = %.3f\n", sz, bs[b],
                       br->rate / js->rate);
        }
        const char *b5s[] = {"5n", "5"};
        for (int b = 0; b < 2; b++) {
            row *b5 = find_row(rows, nrows, b5s[b], sizes[si]);
            if (b5 && jsy && jsy->pack.n && b5->pack.n)
                printf("- publish-ack p50 bridge/JetStream, %s: %s vs 3 = %.2f\n", sz, b5s[b],
                       hist_pct_ms(&b5->pack, 0.5) / hist_pct_ms(&jsy->pack, 0.5));
        }
    }
    fflush(stdout);
    bool interrupted = atomic_load(&g_stop);
    cleanup_all();
    for (int i = 0; i < nrows; i++) free(rows[i]);
    nats_Close();
    curl_global_cleanup();
    if (interrupted) return 130;
    return rc;
}
