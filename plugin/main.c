/* main.c -- fluxon-bridge: arguments, config validation, signals (contract below).
 *
 *   fluxon-bridge -c FILE            run
 *   fluxon-bridge --check -c FILE    validate the config (the file, then fx_daemon_check: the
 *                                    same checks and messages as a start) and exit 0 (2 when
 *                                    invalid)
 *   fluxon-bridge --version          print "fluxon-bridge <version>"
 * Exit codes: 0 clean shutdown, 2 invalid config or arguments (the message names the field),
 * 1 any other fatal error (also a second SIGTERM/SIGINT during the drain).
 * Signals: blocked in every thread before any thread exists; the main thread reads them with a
 * signalfd. SIGTERM/SIGINT: drain and exit 0; again: exit 1 at once. SIGHUP: reload.
 */
#include <curl/curl.h>
#include <openssl/crypto.h>
#include <errno.h>
#include <malloc.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include "config.h"
#include "daemon.h"
#include "fx_log.h"

#define FX_MAIN_MALLOC_ARENAS 2

static void usage(FILE *f)
{
    fprintf(f,
            "usage: fluxon-bridge -c FILE          run the bridge\n"
            "       fluxon-bridge --check -c FILE  validate the configuration and exit\n"
            "       fluxon-bridge --version        print the version\n");
}

/* fx_daemon_check, reported the same way for --check and for a start: a refused setting is an
 * invalid configuration (exit 2), anything else (out of memory, ...) a fatal error (exit 1). */
static int check_daemon(fx_daemon *d, const char *path)
{
    fx_err e = fx_daemon_check(d);
    if (!e) return 0;
    if (e == FX_EINVAL) {
        FX_ERR("invalid configuration: %s: %s", path, fx_err_detail());
        return 2;
    }
    FX_ERR("%s (%s)", fx_strerror(e), fx_err_detail());
    return 1;
}

int main(int argc, char **argv)
{
    /* glibc gives each thread that allocates its own arena (up to 8 per core), and a freed
     * batch buffer (segments and store requests up to ~1.5 MiB, several in flight per channel)
     * stays in the arena of the thread that freed it: with the put workers, claims and delivery
     * threads the RSS grew by arenas, not by data (4 KiB rows of the bench: 56-74 MiB; with two
     * arenas 35-40 MiB, same throughput: BENCHMARKS.md). Before any thread starts. */
    mallopt(M_ARENA_MAX, FX_MAIN_MALLOC_ARENAS);
    /* libnats (3.4) frees OpenSSL's compression-method stack in its own exit handler once it has
     * set up TLS (nats.ca_file, cert_file, tls://); OpenSSL's atexit cleanup then frees it again
     * and the process dies with SIGSEGV on its way out (exit 139 instead of 0 or 2). OpenSSL's
     * exit cleanup only returns memory to a process that is ending: skip it. First, before
     * libcurl or libnats initialise OpenSSL. */
    OPENSSL_init_crypto(OPENSSL_INIT_NO_ATEXIT, NULL);
    const char *path = NULL;
    bool check = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-c") == 0 || strcmp(a, "--config") == 0) {
            if (i + 1 >= argc) {
                fprintf(stderr, "fluxon-bridge: %s: missing FILE\n", a);
                usage(stderr);
                return 2;
            }
            path = argv[++i];
        } else if (strncmp(a, "--config=", 9) == 0) {
            path = a + 9;
        } else if (strcmp(a, "--check") == 0 || strcmp(a, "-t") == 0) {
            check = true;
        } else if (strcmp(a, "--version") == 0 || strcmp(a, "-v") == 0) {
            printf("fluxon-bridge %s\n", FX_BRIDGE_VERSION);
            return 0;
        } else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "fluxon-bridge: unknown argument: %s\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!path || !*path) {
        fprintf(stderr, "fluxon-bridge: -c FILE is required\n");
        usage(stderr);
        return 2;
    }

    fx_config cfg;
    memset(&cfg, 0, sizeof cfg);
    char err[1024] = "";
    if (fx_config_load_file(path, &cfg, err, sizeof err) != 0) {
        FX_ERR("invalid configuration: %s", err); /* err names the file and the field */
        return 2;
    }
    if (check) { /* the same checks as a start (fx_daemon_check), without connecting */
        size_t n_channels = cfg.n_channels;
        curl_global_init(CURL_GLOBAL_DEFAULT); /* as a start does (libcurl and cnats share TLS) */
        fx_daemon *d = NULL;
        fx_err e = fx_daemon_new(&cfg, path, &d);
        if (e) {
            FX_ERR("%s (%s)", fx_strerror(e), fx_err_detail());
            fx_config_free(&cfg);
            curl_global_cleanup();
            return 1;
        }
        int rc = check_daemon(d, path);
        fx_daemon_free(d);
        curl_global_cleanup();
        if (rc) return rc;
        printf("fluxon-bridge: configuration %s is valid (%zu channel(s))\n", path, n_channels);
        return 0;
    }

    /* Before any thread exists (cnats, curl, ours): block the signals we handle here. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGHUP);
    if (pthread_sigmask(SIG_BLOCK, &set, NULL) != 0) {
        FX_ERR("cannot block signals");
        fx_config_free(&cfg);
        return 1;
    }
    int sfd = signalfd(-1, &set, SFD_CLOEXEC);
    if (sfd < 0) {
        FX_ERR("signalfd: %s", strerror(errno));
        fx_config_free(&cfg);
        return 1;
    }
    curl_global_init(CURL_GLOBAL_DEFAULT); /* once, before any thread uses libcurl */

    fx_daemon *d = NULL;
    fx_err e = fx_daemon_new(&cfg, path, &d);
    if (e) {
        FX_ERR("%s (%s)", fx_strerror(e), fx_err_detail());
        fx_config_free(&cfg);
        close(sfd);
        return 1;
    }
    int rc = check_daemon(d, path);
    if (rc) {
        fx_daemon_free(d);
        close(sfd);
        curl_global_cleanup();
        return rc;
    }
    e = fx_daemon_start(d);
    if (e) {
        FX_ERR("start failed: %s (%s)", fx_strerror(e), fx_err_detail());
        fx_daemon_free(d);
        close(sfd);
        curl_global_cleanup();
        /* a setting the daemon refuses (e.g. "nats.nkey_seed_file: ...") is a config error */
        return e == FX_EINVAL ? 2 : 1;
    }

    int stops = 0;
    for (;;) {
        struct pollfd p[2] = {{.fd = sfd, .events = POLLIN}, {.fd = fx_daemon_done_fd(d), .events = POLLIN}};
        int r = poll(p, 2, -1);
        if (r < 0) {
            if (errno == EINTR) continue;
            FX_ERR("poll: %s", strerror(errno));
            break;
        }
        if (p[1].revents) break;
        if (p[0].revents) {
            struct signalfd_siginfo si;
            if (read(sfd, &si, sizeof si) != (ssize_t)sizeof si) continue;
            if (si.ssi_signo == SIGHUP) {
                FX_INF("SIGHUP: reloading %s", path);
                fx_daemon_request_reload(d);
            } else if (++stops == 1) {
                FX_INF("%s: draining (send it again to exit at once)",
                       si.ssi_signo == SIGINT ? "SIGINT" : "SIGTERM");
                fx_daemon_request_stop(d);
            } else {
                FX_WRN("%s again: exiting at once", si.ssi_signo == SIGINT ? "SIGINT" : "SIGTERM");
                _exit(1);
            }
        }
    }
    int code = fx_daemon_exit_code(d);
    fx_daemon_free(d);
    close(sfd);
    curl_global_cleanup();
    FX_INF("exiting (%d)", code);
    return code;
}
