/* fxt_reap.c -- run the e2e runner so that nothing it started outlives it.
 *
 *   fxt-reap CMD [ARG...]        (tests/e2e/run.sh: fxt-reap node lib/main.mjs ...)
 *
 * Becomes a child subreaper (PR_SET_CHILD_SUBREAPER), starts CMD as its child (with
 * PR_SET_PDEATHSIG=SIGKILL, so CMD dies if this process is killed) and waits for it. Whatever CMD
 * started and left behind when it ended -- etcd, nats-server, redis-server, bridges -- is
 * reparented here instead of to init; once CMD has exited, however it exited (also by SIGKILL,
 * when no exit handler of CMD runs), every such process is killed with SIGKILL and reaped.
 * Exits with CMD's status (128 + signal when it was killed). SIGINT, SIGTERM and SIGHUP are
 * passed on to CMD.
 *
 * Why not PR_SET_PDEATHSIG on each child of the runner: on the CI machine (Linux 6.18) a child of
 * node that had set it survived the SIGKILL of node (the same child of a python or C parent did
 * not): the subreaper does not depend on that.
 */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t g_child;

static void forward(int sig)
{
    if (g_child > 0) kill((pid_t)g_child, sig);
}

/* The parent pid in /proc/<pid>/stat (the field after the command name in parentheses). */
static pid_t ppid_of(const char *pid)
{
    char path[300], buf[512];
    snprintf(path, sizeof path, "/proc/%s/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *p = strrchr(buf, ')');
    int ppid = -1;
    if (!p || sscanf(p + 1, " %*c %d", &ppid) != 1) return -1;
    return (pid_t)ppid;
}

/* SIGKILL every process whose parent is this one; returns how many. */
static int kill_children(void)
{
    pid_t self = getpid();
    DIR *d = opendir("/proc");
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!isdigit((unsigned char)e->d_name[0])) continue;
        if (ppid_of(e->d_name) != self) continue;
        pid_t pid = (pid_t)atoi(e->d_name);
        kill(pid, SIGCONT); /* a paused (SIGSTOPped) etcd is killed too */
        if (kill(pid, SIGKILL) == 0) n++;
    }
    closedir(d);
    return n;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: fxt-reap CMD [ARG...]\n");
        return 125;
    }
    if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) perror("fxt-reap: PR_SET_CHILD_SUBREAPER");
    pid_t self = getpid();
    pid_t child = fork();
    if (child < 0) {
        perror("fxt-reap: fork");
        return 125;
    }
    if (child == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != self) _exit(125);
        execvp(argv[1], argv + 1);
        fprintf(stderr, "fxt-reap: cannot run %s: %s\n", argv[1], strerror(errno));
        _exit(127);
    }
    g_child = child;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = forward;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);

    int status = 0, rc = 125;
    for (;;) {
        int st;
        pid_t p = waitpid(-1, &st, 0);
        if (p == child) {
            status = st;
            break;
        }
        if (p < 0 && errno != EINTR) break; /* ECHILD: cannot happen before CMD ended */
    }
    g_child = 0;
    if (WIFEXITED(status)) rc = WEXITSTATUS(status);
    else if (WIFSIGNALED(status)) rc = 128 + WTERMSIG(status);

    /* What CMD left behind is ours now: kill it and reap it, bounded (10 s). */
    int killed = 0;
    struct timespec ts = {0, 50 * 1000000L};
    for (int round = 0; round < 200; round++) {
        while (waitpid(-1, NULL, WNOHANG) > 0) {
        }
        int n = kill_children(); /* again each round: one may have started another meanwhile */
        if (round == 0) killed = n;
        while (waitpid(-1, NULL, WNOHANG) > 0) {
        }
        if (waitpid(-1, NULL, WNOHANG) < 0 && errno == ECHILD) break;
        nanosleep(&ts, NULL); /* pacing of a bounded retry loop, not a synchronisation */
    }
    if (killed) fprintf(stderr, "fxt-reap: %s ended (status %d): killed %d process(es) it left behind\n", argv[1], rc, killed);
    return rc;
}
