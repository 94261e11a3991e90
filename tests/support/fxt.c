/* fxt.c -- test harness: real etcd processes on free loopback ports (see fxt.h). */
#include "fxt.h"
#include "tests/support/fxt_slow.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int64_t fxt_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void pause_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

bool fxt_wait_until(bool (*cond)(void *arg), void *arg, int timeout_ms)
{
    int64_t deadline = fxt_now_ms() + FXT_MS(timeout_ms); /* slow-build factor */
    for (;;) {
        if (cond(arg)) return true;
        if (fxt_now_ms() >= deadline) return cond(arg);
        pause_ms(20);
    }
}

/* Ports handed out by this process, so two calls never return the same one. */
static int used_ports[256];
static int n_used_ports;

static int port_used(int p)
{
    for (int i = 0; i < n_used_ports; i++)
        if (used_ports[i] == p) return 1;
    return 0;
}

/* The low end of the kernel's ephemeral range (where outgoing connections take their local
 * port): ports are picked below it, so no client connection of this or another process can take a
 * port between the pick and the server's bind. What remains (another run picking the same port)
 * is met by the start retries (fresh ports on a first start, the same port after a pause on a
 * restart, when the log says the address is in use). */
static int ephemeral_low(void)
{
    int lo = 32768, hi = 60999;
    FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
    if (f) {
        if (fscanf(f, "%d %d", &lo, &hi) != 2 || lo <= 12000) lo = 32768;
        fclose(f);
    }
    return lo;
}

static bool port_bindable(int p)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return false;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one); /* as the servers bind */
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)p)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bool ok = bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
    close(fd);
    return ok;
}

/* A free port below the ephemeral range, never one this process already handed out. */
static int free_port(void)
{
    static unsigned seed;
    if (!seed) seed = (unsigned)getpid() ^ (unsigned)fxt_now_ms();
    int lo = 10000, hi = ephemeral_low() - 1;
    for (int attempt = 0; attempt < 500; attempt++) {
        int p = lo + (int)(rand_r(&seed) % (unsigned)(hi - lo + 1));
        if (port_used(p) || !port_bindable(p)) continue;
        if (n_used_ports < (int)(sizeof used_ports / sizeof used_ports[0]))
            used_ports[n_used_ports++] = p;
        return p;
    }
    return -1;
}

/* Did the log at `path` (from byte `from`) say a listener's address is in use? */
static bool log_says_in_use(const char *path, long from)
{
    FILE *f = fopen(path, "r");
    if (!f) return false;
    bool hit = false;
    char line[1024];
    if (from > 0) fseek(f, from, SEEK_SET);
    while (!hit && fgets(line, sizeof line, f))
        hit = strcasestr(line, "address already in use") != NULL;
    fclose(f);
    return hit;
}

static long file_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : 0;
}

/* Restart on a port another process may hold for a moment: try again after a pause while the
 * log says "address already in use" (3 tries, the pauses 0.3 s, 0.6 s: bounded). */
#define RESTART_TRIES 3
static void restart_pause(int attempt) { pause_ms(300 * (attempt + 1)); }

int fxt_dead_port(void) { return free_port(); }

int fxt_blackhole_listen(int *port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(fd, 64) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
        close(fd);
        return -1;
    }
    *port = ntohs(a.sin_port);
    return fd;
}

static const char *tmp_root(void)
{
    const char *t = getenv("FXT_TMPDIR");
    return (t && *t) ? t : "/tmp";
}

static void write_pidfile(const fxt_etcd *e)
{
    char path[600];
    snprintf(path, sizeof path, "%s.pid", e->dir);
    FILE *f = fopen(path, "w");
    if (!f) return;
    fprintf(f, "%d\n", (int)e->pid);
    fclose(f);
}

static void remove_pidfile(const fxt_etcd *e)
{
    char path[600];
    snprintf(path, sizeof path, "%s.pid", e->dir);
    unlink(path);
}

static bool http_ok(int port, const char *path, const char *want);

/* etcd answers GET /health with {"health":"true"} when it is ready. */
static bool etcd_healthy(int port) { return http_ok(port, "/health", "\"health\":\"true\""); }

static bool child_alive(pid_t pid)
{
    int st;
    pid_t r = waitpid(pid, &st, WNOHANG);
    return r == 0;
}

static int spawn(fxt_etcd *e, bool fresh)
{
    char client_url[64], peer_url[64], cluster[96];
    snprintf(client_url, sizeof client_url, "http://127.0.0.1:%d", e->client_port);
    snprintf(peer_url, sizeof peer_url, "http://127.0.0.1:%d", e->peer_port);
    snprintf(cluster, sizeof cluster, "fxt=%s", peer_url);
    const char *bin = getenv("FXT_ETCD_BIN");
    if (!bin || !*bin) bin = "etcd";

    char *argv[64];
    int ac = 0;
    argv[ac++] = (char *)bin;
    argv[ac++] = (char *)"--name=fxt";
    static char a_dir[600], a_lc[96], a_ac[96], a_lp[96], a_ip[96], a_ic[128];
    snprintf(a_dir, sizeof a_dir, "--data-dir=%s", e->dir);
    snprintf(a_lc, sizeof a_lc, "--listen-client-urls=%s", client_url);
    snprintf(a_ac, sizeof a_ac, "--advertise-client-urls=%s", client_url);
    snprintf(a_lp, sizeof a_lp, "--listen-peer-urls=%s", peer_url);
    snprintf(a_ip, sizeof a_ip, "--initial-advertise-peer-urls=%s", peer_url);
    snprintf(a_ic, sizeof a_ic, "--initial-cluster=%s", cluster);
    argv[ac++] = a_dir;
    argv[ac++] = a_lc;
    argv[ac++] = a_ac;
    argv[ac++] = a_lp;
    argv[ac++] = a_ip;
    argv[ac++] = a_ic;
    argv[ac++] = (char *)(fresh ? "--initial-cluster-state=new" : "--initial-cluster-state=existing");
    argv[ac++] = (char *)"--logger=zap";
    argv[ac++] = (char *)"--log-level=warn";
    static char extra[256];
    snprintf(extra, sizeof extra, "%s", e->extra_args);
    for (char *save = NULL, *tok = strtok_r(extra, " ", &save); tok && ac < 62;
         tok = strtok_r(NULL, " ", &save))
        argv[ac++] = tok;
    argv[ac] = NULL;

    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        perror("fxt: fork");
        return -1;
    }
    if (pid == 0) {
        /* Die with the test process, whatever way it ends. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(127);
        setpgid(0, 0);
        int fd = open(e->log_path, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            close(fd);
        }
        int devnull = open("/dev/null", O_RDONLY);
        if (devnull >= 0) {
            dup2(devnull, 0);
            close(devnull);
        }
        execvp(bin, argv);
        _exit(127);
    }
    e->pid = pid;
    write_pidfile(e);

    int64_t deadline = fxt_now_ms() + FXT_MS(20000);
    while (fxt_now_ms() < deadline) {
        if (!child_alive(pid)) {
            fprintf(stderr, "fxt: etcd exited during start-up; log: %s\n", e->log_path);
            e->pid = 0;
            remove_pidfile(e);
            return -1;
        }
        if (etcd_healthy(e->client_port)) return 0;
        pause_ms(50);
    }
    fprintf(stderr, "fxt: etcd not healthy within 20 s; log: %s\n", e->log_path);
    fxt_etcd_stop(e);
    return -1;
}

int fxt_etcd_start(fxt_etcd *e)
{
    char extra[sizeof e->extra_args];
    snprintf(extra, sizeof extra, "%s", e->extra_args);
    memset(e, 0, sizeof *e);
    snprintf(e->extra_args, sizeof e->extra_args, "%s", extra);
    for (int attempt = 0; attempt < 3; attempt++) {
        snprintf(e->dir, sizeof e->dir, "%s/fxt-etcd-XXXXXX", tmp_root());
        if (!mkdtemp(e->dir)) {
            perror("fxt: mkdtemp");
            return -1;
        }
        snprintf(e->log_path, sizeof e->log_path, "%s.log", e->dir);
        e->client_port = free_port();
        e->peer_port = free_port();
        if (e->client_port < 0 || e->peer_port < 0) return -1;
        snprintf(e->endpoint, sizeof e->endpoint, "http://127.0.0.1:%d", e->client_port);
        if (spawn(e, true) == 0) return 0;
        fxt_etcd_destroy(e); /* port race or bad start: try fresh ports */
    }
    return -1;
}

int fxt_etcd_stop(fxt_etcd *e)
{
    if (e->pid <= 0) return 0;
    kill(e->pid, SIGCONT); /* in case it was paused */
    kill(e->pid, SIGTERM);
    int64_t deadline = fxt_now_ms() + 5000;
    int st;
    for (;;) {
        pid_t r = waitpid(e->pid, &st, WNOHANG);
        if (r == e->pid || (r < 0 && errno == ECHILD)) break;
        if (fxt_now_ms() >= deadline) {
            kill(e->pid, SIGKILL);
            waitpid(e->pid, &st, 0);
            break;
        }
        pause_ms(20);
    }
    e->pid = 0;
    remove_pidfile(e);
    return 0;
}

int fxt_etcd_restart(fxt_etcd *e)
{
    if (e->pid > 0) fxt_etcd_stop(e);
    for (int attempt = 0;; attempt++) {
        long from = file_size(e->log_path);
        if (spawn(e, false) == 0) return 0;
        if (attempt + 1 >= RESTART_TRIES || !log_says_in_use(e->log_path, from)) return -1;
        fprintf(stderr, "fxt: etcd restart: port in use, trying again\n");
        restart_pause(attempt);
    }
}

int fxt_etcd_pause(fxt_etcd *e) { return e->pid > 0 ? kill(e->pid, SIGSTOP) : -1; }

int fxt_etcd_resume(fxt_etcd *e) { return e->pid > 0 ? kill(e->pid, SIGCONT) : -1; }

static void rm_rf(const char *path)
{
    /* The data dir holds only etcd's files; a shell-free recursive delete via nftw would be
     * longer; rm -rf through posix_spawn-like fork/exec keeps this small and safe (fixed argv,
     * no shell). */
    pid_t pid = fork();
    if (pid == 0) {
        execlp("rm", "rm", "-rf", "--", path, (char *)NULL);
        _exit(127);
    }
    if (pid > 0) {
        int st;
        waitpid(pid, &st, 0);
    }
}

void fxt_etcd_destroy(fxt_etcd *e)
{
    fxt_etcd_stop(e);
    if (e->dir[0]) {
        rm_rf(e->dir);
        unlink(e->log_path);
        e->dir[0] = '\0';
    }
}

/* ---- nats-server ---------------------------------------------------------------------------- */

/* GET <path> over a raw socket on 127.0.0.1:port: true on HTTP 200 whose body contains `want`. */
static bool http_ok(int port, const char *path, const char *want)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return false;
    struct timeval tv = {1, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bool ok = false;
    if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0) {
        char req[256];
        int len = snprintf(req, sizeof req, "GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n", path);
        if (len > 0 && write(fd, req, (size_t)len) == (ssize_t)len) {
            char buf[2048];
            size_t got = 0;
            ssize_t r;
            while (got < sizeof buf - 1 && (r = read(fd, buf + got, sizeof buf - 1 - got)) > 0)
                got += (size_t)r;
            buf[got] = '\0';
            ok = strncmp(buf, "HTTP/1.", 7) == 0 && strstr(buf, " 200 ") && strstr(buf, want);
        }
    }
    close(fd);
    return ok;
}

static int nats_write_conf(const fxt_nats *n)
{
    FILE *f = fopen(n->conf, "w");
    if (!f) return -1;
    fprintf(f, "listen: \"127.0.0.1:%d\"\nhttp: \"127.0.0.1:%d\"\n", n->port, n->mport);
    if (n->leafnodes) fprintf(f, "leafnodes {\n  listen: \"127.0.0.1:%d\"\n}\n", n->lport);
    if (n->extra_conf[0]) fprintf(f, "%s\n", n->extra_conf);
    return fclose(f) == 0 ? 0 : -1;
}

static void nats_write_pid(const fxt_nats *n)
{
    FILE *f = fopen(n->pidfile, "w");
    if (!f) return;
    fprintf(f, "%d\n", (int)n->pid);
    fclose(f);
}

static int nats_spawn(fxt_nats *n)
{
    const char *bin = getenv("FXT_NATS_BIN");
    if (!bin || !*bin) bin = "nats-server";
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        perror("fxt: fork");
        return -1;
    }
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(127);
        setpgid(0, 0);
        int fd = open(n->log_path, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            close(fd);
        }
        int dn = open("/dev/null", O_RDONLY);
        if (dn >= 0) {
            dup2(dn, 0);
            close(dn);
        }
        execlp(bin, bin, "-c", n->conf, (char *)NULL);
        _exit(127);
    }
    n->pid = pid;
    nats_write_pid(n);
    int64_t deadline = fxt_now_ms() + FXT_MS(20000);
    while (fxt_now_ms() < deadline) {
        if (!child_alive(pid)) {
            fprintf(stderr, "fxt: nats-server exited during start-up; log: %s\n", n->log_path);
            n->pid = 0;
            unlink(n->pidfile);
            return -1;
        }
        /* /healthz answers ok once every listener is up */
        if (http_ok(n->mport, "/healthz", "\"status\":\"ok\"")) return 0;
        pause_ms(50);
    }
    fprintf(stderr, "fxt: nats-server not healthy within 20 s; log: %s\n", n->log_path);
    fxt_nats_stop(n);
    return -1;
}

int fxt_nats_start(fxt_nats *n)
{
    bool leaf = n->leafnodes;
    char extra[sizeof n->extra_conf];
    snprintf(extra, sizeof extra, "%s", n->extra_conf);
    memset(n, 0, sizeof *n);
    n->leafnodes = leaf;
    snprintf(n->extra_conf, sizeof n->extra_conf, "%s", extra);
    static int seq;
    int id = ++seq;
    snprintf(n->conf, sizeof n->conf, "%s/fxt-nats-%d-%d.conf", tmp_root(), (int)getpid(), id);
    snprintf(n->log_path, sizeof n->log_path, "%s/fxt-nats-%d-%d.log", tmp_root(), (int)getpid(), id);
    snprintf(n->pidfile, sizeof n->pidfile, "%s/fxt-nats-%d-%d.pid", tmp_root(), (int)getpid(), id);
    for (int attempt = 0; attempt < 3; attempt++) {
        n->port = free_port();
        n->mport = free_port();
        n->lport = leaf ? free_port() : 0;
        if (n->port < 0 || n->mport < 0 || n->lport < 0) return -1;
        snprintf(n->url, sizeof n->url, "nats://127.0.0.1:%d", n->port);
        snprintf(n->monitor_url, sizeof n->monitor_url, "http://127.0.0.1:%d", n->mport);
        if (leaf) snprintf(n->leaf_url, sizeof n->leaf_url, "nats://127.0.0.1:%d", n->lport);
        if (nats_write_conf(n) != 0) return -1;
        if (nats_spawn(n) == 0) return 0; /* else a port race: try fresh ports */
    }
    return -1;
}

int fxt_nats_stop(fxt_nats *n)
{
    if (n->pid <= 0) return 0;
    kill(n->pid, SIGCONT);
    kill(n->pid, SIGTERM);
    int64_t deadline = fxt_now_ms() + 5000;
    int st;
    for (;;) {
        pid_t r = waitpid(n->pid, &st, WNOHANG);
        if (r == n->pid || (r < 0 && errno == ECHILD)) break;
        if (fxt_now_ms() >= deadline) {
            kill(n->pid, SIGKILL);
            waitpid(n->pid, &st, 0);
            break;
        }
        pause_ms(20);
    }
    n->pid = 0;
    unlink(n->pidfile);
    return 0;
}

int fxt_nats_restart(fxt_nats *n)
{
    if (n->pid > 0) fxt_nats_stop(n);
    for (int attempt = 0;; attempt++) {
        long from = file_size(n->log_path);
        if (nats_spawn(n) == 0) return 0;
        if (attempt + 1 >= RESTART_TRIES || !log_says_in_use(n->log_path, from)) return -1;
        fprintf(stderr, "fxt: nats-server restart: port in use, trying again\n");
        restart_pause(attempt);
    }
}

int fxt_nats_pause(fxt_nats *n) { return n->pid > 0 ? kill(n->pid, SIGSTOP) : -1; }

int fxt_nats_resume(fxt_nats *n) { return n->pid > 0 ? kill(n->pid, SIGCONT) : -1; }

void fxt_nats_destroy(fxt_nats *n)
{
    fxt_nats_stop(n);
    if (n->conf[0]) {
        unlink(n->conf);
        unlink(n->log_path);
        n->conf[0] = '\0';
    }
}

/* ---- redis-server --------------------------------------------------------------------------- */

/* PING over a raw socket on 127.0.0.1:port: true when the answer is +PONG. */
static bool redis_pong(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return false;
    struct timeval tv = {1, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bool ok = false;
    if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0 && write(fd, "PING\r\n", 6) == 6) {
        char buf[16] = {0};
        ssize_t n = read(fd, buf, sizeof buf - 1);
        ok = n >= 5 && strncmp(buf, "+PONG", 5) == 0;
    }
    close(fd);
    return ok;
}

static int redis_spawn(fxt_redis *r)
{
    const char *bin = getenv("FXT_REDIS_BIN");
    if (!bin || !*bin) bin = "redis-server";
    char port[16];
    snprintf(port, sizeof port, "%d", r->port);
    bool aof = r->appendfsync[0] != 0;
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        perror("fxt: fork");
        return -1;
    }
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(127);
        setpgid(0, 0);
        int fd = open(r->log_path, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            close(fd);
        }
        int dn = open("/dev/null", O_RDONLY);
        if (dn >= 0) {
            dup2(dn, 0);
            close(dn);
        }
        execlp(bin, bin, "--port", port, "--bind", "127.0.0.1", "--dir", r->dir, "--save", "",
               "--appendonly", aof ? "yes" : "no", "--appendfsync",
               aof ? r->appendfsync : "everysec", "--daemonize", "no", "--protected-mode", "no",
               (char *)NULL);
        _exit(127);
    }
    r->pid = pid;
    FILE *f = fopen(r->pidfile, "w");
    if (f) {
        fprintf(f, "%d\n", (int)pid);
        fclose(f);
    }
    int64_t deadline = fxt_now_ms() + FXT_MS(20000);
    while (fxt_now_ms() < deadline) {
        if (!child_alive(pid)) {
            fprintf(stderr, "fxt: redis-server exited during start-up; log: %s\n", r->log_path);
            r->pid = 0;
            unlink(r->pidfile);
            return -1;
        }
        if (redis_pong(r->port)) return 0;
        pause_ms(20);
    }
    fprintf(stderr, "fxt: redis-server not answering within 20 s; log: %s\n", r->log_path);
    fxt_redis_kill(r);
    return -1;
}

int fxt_redis_start(fxt_redis *r)
{
    char fs[sizeof r->appendfsync];
    snprintf(fs, sizeof fs, "%s", r->appendfsync);
    memset(r, 0, sizeof *r);
    snprintf(r->appendfsync, sizeof r->appendfsync, "%s", fs);
    static int seq;
    snprintf(r->dir, sizeof r->dir, "%s/fxt-redis-%d-%d", tmp_root(), (int)getpid(), ++seq);
    if (mkdir(r->dir, 0700) != 0) {
        perror("fxt: mkdir redis dir");
        return -1;
    }
    snprintf(r->log_path, sizeof r->log_path, "%s.log", r->dir);
    snprintf(r->pidfile, sizeof r->pidfile, "%s.pid", r->dir);
    for (int attempt = 0; attempt < 3; attempt++) {
        r->port = free_port();
        if (r->port < 0) return -1;
        snprintf(r->url, sizeof r->url, "redis://127.0.0.1:%d", r->port);
        if (redis_spawn(r) == 0) return 0;
    }
    return -1;
}

int fxt_redis_kill(fxt_redis *r)
{
    if (r->pid <= 0) return 0;
    kill(r->pid, SIGCONT);
    kill(r->pid, SIGKILL);
    int st;
    waitpid(r->pid, &st, 0);
    r->pid = 0;
    unlink(r->pidfile);
    return 0;
}

int fxt_redis_restart(fxt_redis *r)
{
    if (r->pid > 0) fxt_redis_kill(r);
    for (int attempt = 0;; attempt++) {
        long from = file_size(r->log_path);
        if (redis_spawn(r) == 0) return 0;
        if (attempt + 1 >= RESTART_TRIES || !log_says_in_use(r->log_path, from)) return -1;
        fprintf(stderr, "fxt: redis-server restart: port in use, trying again\n");
        restart_pause(attempt);
    }
}

void fxt_redis_destroy(fxt_redis *r)
{
    fxt_redis_kill(r);
    if (r->dir[0]) {
        rm_rf(r->dir);
        unlink(r->log_path);
        r->dir[0] = '\0';
    }
}
