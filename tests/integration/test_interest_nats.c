/* test_interest_nats.c -- fx_interest_fetch against a real nats-server (monitoring on), with a
 * cnats client making the subscriptions.
 *
 * interest_literal_subjects_only: q.orders.alice, q.orders.bob (twice, one queue group),
 *   q.orders.> and $foo -> exactly {q.orders.alice, q.orders.bob}; with the client's cid excluded
 *   the set is empty; after unsubscribing alice it disappears.
 * interest_paging_2500: 2500 literal subjects (more than two pages of 1024) are all found.
 * interest_http_errors: a non-200 answer and a refused connection are FX_EUNAVAIL; a server
 *   that never answers is FX_ETIMEDOUT within the deadline.
 *
 * The nats-server is started here (fork/exec, PR_SET_PDEATHSIG, pidfile under $FXT_TMPDIR so
 * tests/run.sh kills leftovers) and killed and reaped in the group teardown.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <nats/nats.h>

#include "interest.h"
#include "tests/support/fxt.h"

#define ACCOUNT "$G" /* no config file: every client is in the global account */
#define FETCH_MS 5000
#define N_PAGING 2500

static struct {
    pid_t pid;
    int port, mport;
    char url[64], murl[64];
    char pidfile[512], logfile[512];
} srv;

/* ---- nats-server process -------------------------------------------------------------------- */

static void pause_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static const char *tmp_root(void)
{
    const char *t = getenv("FXT_TMPDIR");
    return (t && *t) ? t : "/tmp";
}

/* GET /healthz over a raw socket: true on a 200 with {"status":"ok"}. */
static bool nats_healthy(int mport)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return false;
    struct timeval tv = {1, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)mport)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bool ok = false;
    if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0) {
        static const char req[] = "GET /healthz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
        if (write(fd, req, sizeof req - 1) == (ssize_t)(sizeof req - 1)) {
            char buf[2048];
            size_t got = 0;
            ssize_t n;
            while (got < sizeof buf - 1 && (n = read(fd, buf + got, sizeof buf - 1 - got)) > 0)
                got += (size_t)n;
            buf[got] = '\0';
            ok = strncmp(buf, "HTTP/1.", 7) == 0 && strstr(buf, " 200 ") &&
                 strstr(buf, "\"status\":\"ok\"");
        }
    }
    close(fd);
    return ok;
}

static void server_kill(void)
{
    if (srv.pid > 0) {
        kill(srv.pid, SIGTERM);
        int64_t deadline = fxt_now_ms() + 5000;
        int st;
        for (;;) {
            pid_t r = waitpid(srv.pid, &st, WNOHANG);
            if (r == srv.pid || (r < 0 && errno == ECHILD)) break;
            if (fxt_now_ms() >= deadline) {
                kill(srv.pid, SIGKILL);
                waitpid(srv.pid, &st, 0);
                break;
            }
            pause_ms(20);
        }
        srv.pid = 0;
    }
    if (srv.pidfile[0]) unlink(srv.pidfile);
}

static int server_spawn(void)
{
    char p[16], m[16];
    snprintf(p, sizeof p, "%d", srv.port);
    snprintf(m, sizeof m, "%d", srv.mport);
    const char *bin = getenv("FXT_NATS_BIN");
    if (!bin || !*bin) bin = "nats-server";
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(127);
        setpgid(0, 0);
        int fd = open(srv.logfile, O_WRONLY | O_CREAT | O_TRUNC, 0644);
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
        execlp(bin, bin, "-a", "127.0.0.1", "-p", p, "-m", m, (char *)NULL);
        _exit(127);
    }
    srv.pid = pid;
    FILE *f = fopen(srv.pidfile, "w");
    if (f) {
        fprintf(f, "%d\n", (int)pid);
        fclose(f);
    }
    int64_t deadline = fxt_now_ms() + 20000;
    while (fxt_now_ms() < deadline) {
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            fprintf(stderr, "nats-server exited during start-up; log: %s\n", srv.logfile);
            srv.pid = 0;
            unlink(srv.pidfile);
            return -1;
        }
        if (nats_healthy(srv.mport)) return 0;
        pause_ms(50);
    }
    fprintf(stderr, "nats-server not healthy within 20 s; log: %s\n", srv.logfile);
    server_kill();
    return -1;
}

static int group_setup(void **state)
{
    (void)state;
    snprintf(srv.pidfile, sizeof srv.pidfile, "%s/fxt-nats-interest-%d.pid", tmp_root(),
             (int)getpid());
    snprintf(srv.logfile, sizeof srv.logfile, "%s/fxt-nats-interest-%d.log", tmp_root(),
             (int)getpid());
    for (int attempt = 0; attempt < 3; attempt++) {
        srv.port = fxt_dead_port();
        srv.mport = fxt_dead_port();
        if (srv.port <= 0 || srv.mport <= 0) return -1;
        snprintf(srv.url, sizeof srv.url, "nats://127.0.0.1:%d", srv.port);
        snprintf(srv.murl, sizeof srv.murl, "http://127.0.0.1:%d", srv.mport);
        if (server_spawn() == 0) return 0; /* else a port race: try fresh ports */
    }
    FILE *f = fopen(srv.logfile, "r"); /* show why, then leave nothing behind */
    if (f) {
        char buf[4096];
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        buf[n] = '\0';
        fprintf(stderr, "nats-server log:\n%s\n", buf);
        fclose(f);
    }
    unlink(srv.logfile);
    return -1;
}

static int group_teardown(void **state)
{
    (void)state;
    server_kill();
    unlink(srv.logfile);
    nats_Close();
    return 0;
}

/* ---- helpers -------------------------------------------------------------------------------- */

static natsConnection *connect_client(void)
{
    natsConnection *nc = NULL;
    natsStatus s = natsConnection_ConnectTo(&nc, srv.url);
    if (s != NATS_OK) fail_msg("connect %s: %s", srv.url, natsStatus_GetText(s));
    return nc;
}

static natsSubscription *sub(natsConnection *nc, const char *subject, const char *queue)
{
    natsSubscription *s = NULL;
    natsStatus st = queue ? natsConnection_QueueSubscribeSync(&s, nc, subject, queue)
                          : natsConnection_SubscribeSync(&s, nc, subject);
    if (st != NATS_OK) fail_msg("subscribe %s: %s", subject, natsStatus_GetText(st));
    return s;
}

static void flush(natsConnection *nc)
{
    natsStatus s = natsConnection_FlushTimeout(nc, 5000);
    if (s != NATS_OK) fail_msg("flush: %s", natsStatus_GetText(s));
}

static size_t count_prefix(const fx_interest *set, const char *prefix)
{
    size_t n = 0, pl = strlen(prefix);
    for (size_t i = 0; i < set->n; i++)
        if (strncmp(set->subjects[i], prefix, pl) == 0) n++;
    return n;
}

typedef struct {
    uint64_t cid;
    bool want_alice;
} poll_arg;

static bool alice_state_is(void *p)
{
    const poll_arg *a = p;
    fx_interest set = {0};
    if (fx_interest_fetch(srv.murl, ACCOUNT, NULL, 0, FETCH_MS, &set) != FX_OK) return false;
    bool ok = fx_interest_has(&set, "q.orders.alice") == a->want_alice &&
              fx_interest_has(&set, "q.orders.bob") && count_prefix(&set, "q.orders.") ==
                                                           (a->want_alice ? 2u : 1u);
    fx_interest_free(&set);
    return ok;
}

/* ---- tests ---------------------------------------------------------------------------------- */

static void interest_literal_subjects_only(void **state)
{
    (void)state;
    natsConnection *nc = connect_client();
    natsSubscription *alice = sub(nc, "q.orders.alice", NULL);
    natsSubscription *bob1 = sub(nc, "q.orders.bob", "workers");
    natsSubscription *bob2 = sub(nc, "q.orders.bob", "workers");
    natsSubscription *wild = sub(nc, "q.orders.>", NULL);
    natsSubscription *dollar = sub(nc, "$foo", NULL);
    flush(nc);

    fx_interest set = {0};
    fx_err rc = fx_interest_fetch(srv.murl, ACCOUNT, NULL, 0, FETCH_MS, &set);
    if (rc != FX_OK) fail_msg("fetch: %s: %s", fx_errname(rc), fx_err_detail());
    /* Nothing else literal is subscribed in $G, so the whole set is exact. */
    assert_int_equal(set.n, 2);
    assert_string_equal(set.subjects[0], "q.orders.alice");
    assert_string_equal(set.subjects[1], "q.orders.bob");
    assert_false(fx_interest_has(&set, "q.orders.>"));
    assert_false(fx_interest_has(&set, "$foo"));
    assert_string_equal(fx_interest_claim_token("q.orders", set.subjects[0]), "alice");
    fx_interest_free(&set);

    /* The monitor URL may end with '/'; the account is URL-encoded ($ -> %24). */
    char slash[80];
    snprintf(slash, sizeof slash, "%s/", srv.murl);
    assert_int_equal(fx_interest_fetch(slash, ACCOUNT, NULL, 0, FETCH_MS, &set), FX_OK);
    assert_int_equal(set.n, 2);
    fx_interest_free(&set);

    /* Another account sees nothing. */
    assert_int_equal(fx_interest_fetch(srv.murl, "$SYS", NULL, 0, FETCH_MS, &set), FX_OK);
    assert_int_equal(set.n, 0);
    fx_interest_free(&set);

    /* This client's own subscriptions excluded (as the bridge excludes its own). */
    uint64_t cid = 0;
    assert_int_equal(natsConnection_GetClientID(nc, &cid), NATS_OK);
    const uint64_t ex[] = {cid + 1000, cid};
    assert_int_equal(fx_interest_fetch(srv.murl, ACCOUNT, ex, 2, FETCH_MS, &set), FX_OK);
    assert_int_equal(set.n, 0);
    fx_interest_free(&set);

    /* alice leaves: gone from the next fetches (poll with a deadline), bob stays. */
    assert_int_equal(natsSubscription_Unsubscribe(alice), NATS_OK);
    flush(nc);
    poll_arg pa = {cid, false};
    assert_true(fxt_wait_until(alice_state_is, &pa, 5000));

    /* One queue member of bob leaves: bob still has interest. */
    assert_int_equal(natsSubscription_Unsubscribe(bob1), NATS_OK);
    flush(nc);
    assert_int_equal(fx_interest_fetch(srv.murl, ACCOUNT, NULL, 0, FETCH_MS, &set), FX_OK);
    assert_true(fx_interest_has(&set, "q.orders.bob"));
    fx_interest_free(&set);

    natsSubscription_Destroy(alice);
    natsSubscription_Destroy(bob1);
    natsSubscription_Destroy(bob2);
    natsSubscription_Destroy(wild);
    natsSubscription_Destroy(dollar);
    natsConnection_Destroy(nc);
}

typedef struct {
    size_t want;
    size_t got;
} paging_arg;

static bool all_paging_subjects_found(void *p)
{
    paging_arg *a = p;
    fx_interest set = {0};
    fx_err rc = fx_interest_fetch(srv.murl, ACCOUNT, NULL, 0, FETCH_MS, &set);
    if (rc != FX_OK) {
        fprintf(stderr, "fetch: %s: %s\n", fx_errname(rc), fx_err_detail());
        return false;
    }
    a->got = count_prefix(&set, "page.");
    bool ok = a->got == a->want;
    for (size_t i = 0; ok && i < a->want; i++) {
        char s[32];
        snprintf(s, sizeof s, "page.%zu", i);
        ok = fx_interest_has(&set, s);
    }
    fx_interest_free(&set);
    return ok;
}

static void interest_paging_2500(void **state)
{
    (void)state;
    natsConnection *nc = connect_client();
    natsSubscription **subs = calloc(N_PAGING, sizeof *subs);
    assert_non_null(subs);
    for (size_t i = 0; i < N_PAGING; i++) {
        char s[32];
        snprintf(s, sizeof s, "page.%zu", i);
        subs[i] = sub(nc, s, NULL);
    }
    flush(nc);
    paging_arg pa = {N_PAGING, 0};
    /* Every fetch must be complete: check several in a row, not just one lucky one. */
    for (int round = 0; round < 5; round++) {
        if (!all_paging_subjects_found(&pa))
            fail_msg("round %d: %zu of %d subjects found", round, pa.got, N_PAGING);
    }
    for (size_t i = 0; i < N_PAGING; i++) natsSubscription_Destroy(subs[i]);
    free(subs);
    natsConnection_Destroy(nc);
}

static void interest_http_errors(void **state)
{
    (void)state;
    fx_interest set = {0};
    char url[96];
    /* nats-server answers 404 below an unknown path. */
    snprintf(url, sizeof url, "%s/nope", srv.murl);
    assert_int_equal(fx_interest_fetch(url, ACCOUNT, NULL, 0, FETCH_MS, &set), FX_EUNAVAIL);
    assert_non_null(strstr(fx_err_detail(), "HTTP 404"));
    assert_int_equal(set.n, 0);

    int dead = fxt_dead_port();
    snprintf(url, sizeof url, "http://127.0.0.1:%d", dead);
    assert_int_equal(fx_interest_fetch(url, ACCOUNT, NULL, 0, FETCH_MS, &set), FX_EUNAVAIL);

    int bport = 0;
    int bfd = fxt_blackhole_listen(&bport);
    assert_true(bfd >= 0);
    snprintf(url, sizeof url, "http://127.0.0.1:%d", bport);
    int64_t t0 = fxt_now_ms();
    assert_int_equal(fx_interest_fetch(url, ACCOUNT, NULL, 0, 300, &set), FX_ETIMEDOUT);
    int64_t took = fxt_now_ms() - t0;
    assert_true(took >= 250 && took < 2000);
    assert_int_equal(set.n, 0);
    close(bfd);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(interest_literal_subjects_only),
        cmocka_unit_test(interest_paging_2500),
        cmocka_unit_test(interest_http_errors),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
