/* fluxonctl.c -- a small CLI over the bridge's admin API, plus pub/sub helpers for demos.
 *
 *   fluxonctl [--server URL] [--timeout D] [--creds FILE] <command> [args] [options]
 *     channels                       $FLUXON.API.CHANNEL.LIST as a table (--json: raw JSON)
 *     info <channel>                 $FLUXON.API.CHANNEL.INFO.<channel> summary (--json: JSON)
 *     bridge-info                    $FLUXON.API.INFO (JSON)
 *     pub <subject> <data>           publish; --ack: request and print the PubAck;
 *                                    -H/--header K:V (repeatable); --count N (N copies)
 *     sub <subject>                  subscribe and print messages with headers;
 *                                    --ack (reply +ACK) | --nak (reply -NAK); --count N (exit
 *                                    after N); --wait D (exit after D without a message);
 *                                    --queue G; --quiet (one line per message)
 *     dlq ls <ch>-dlq                why each dead letter died (Fluxon-Dead-Reason/-Detail)
 *     redrive <ch>-dlq               move dead letters back to their channel (see cmd_redrive)
 * Exit codes: 0 ok, 1 error (message on stderr), 2 usage. Every wait is bounded by --timeout
 * (default 2s) except `sub`, which runs until Ctrl-C, --count or --wait. Ctrl-C (SIGINT) or
 * SIGTERM stops any command cleanly (subscription drained, connection closed).
 * Credentials (in the URL or a creds file) are never printed: URLs are shown without user info.
 */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include <cjson/cJSON.h>
#include <nats/nats.h>

#include "fx_url.h"
#include "redrive.h"

#define CTL_DEFAULT_SERVER "nats://127.0.0.1:4222"
#define CTL_DEFAULT_TIMEOUT_MS 2000
#define CTL_MAX_HEADERS 32
#define CTL_MAX_ARGS 8
#define CTL_POLL_MS 100
#define CTL_MAX_REPLY_PRINT (1 << 20)

static volatile sig_atomic_t g_stop;

static void on_signal(int sig)
{
    (void)sig;
    g_stop = 1;
}

typedef struct opts {
    const char *server;
    int64_t timeout_ms;
    const char *creds;
    bool json, ack, nak, quiet;
    bool api; /* redrive --api: a bridge runs it ($FLUXON.API.CHANNEL.REDRIVE) */
    int64_t count; /* 0: unlimited (sub) / 1 (pub) */
    int64_t wait_ms; /* sub: exit after this long without a message; 0: never */
    const char *queue;
    const char *to;      /* redrive --to */
    int64_t max, rate;   /* redrive / dlq ls --max; redrive --rate (letters/s) */
    int64_t deadline_ms; /* redrive / dlq ls: stop after */
    const char *headers[CTL_MAX_HEADERS];
    int n_headers;
    const char *args[CTL_MAX_ARGS];
    int n_args;
} opts;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: fluxonctl [--server URL] [--timeout D] [--creds FILE] <command> [args]\n"
            "\n"
            "commands:\n"
            "  channels                      list configured channels with their backlog\n"
            "  info <channel>                sub-MPSCs, claims, members, offsets and backlog\n"
            "  bridge-info                   $FLUXON.API.INFO of one bridge\n"
            "  pub <subject> <data>          publish (--ack: wait for the PubAck; -H K:V; --count N)\n"
            "  sub <subject>                 print messages (--ack | --nak; --count N; --wait D;\n"
            "                                --queue G; --quiet)\n"
            "  dlq ls <ch>-dlq               why each dead letter died (--max N, default 100, at most\n"
            "                                10000; --wait D idle end, default 1s; --json); letters are\n"
            "                                NAKed back and stay in the DLQ\n"
            "  redrive <ch>-dlq              move dead letters back, at least once (--to CH, default\n"
            "                                <ch>; --max N, default 1000, at most 100000; --rate R/s,\n"
            "                                default 100, at most 10000; --deadline D, default 10m,\n"
            "                                at most 24h; --wait D idle end, default 2s; --json;\n"
            "                                --api: a bridge runs it, $FLUXON.API.CHANNEL.REDRIVE)\n"
            "\n"
            "options:\n"
            "  -s, --server URL   NATS server (default $NATS_URL or " CTL_DEFAULT_SERVER ")\n"
            "  -t, --timeout D    request/connect timeout: 250ms, 2s, 1m or seconds (default 2s)\n"
            "      --creds FILE   NATS user credentials file\n"
            "      --json         print the raw JSON answer (channels, info)\n"
            "  -h, --help         this text\n"
            "\n"
            "exit status: 0 ok, 1 error, 2 usage\n");
}

/* "250ms", "2s", "1m", "1h" or a number of seconds -> ms (> 0). */
static int parse_duration(const char *s, int64_t *out)
{
    if (!s || !*s) return -1;
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || !(v > 0) || v > 86400.0 * 365) return -1;
    double mul;
    if (*end == '\0' || strcmp(end, "s") == 0)
        mul = 1000;
    else if (strcmp(end, "ms") == 0)
        mul = 1;
    else if (strcmp(end, "m") == 0)
        mul = 60000;
    else if (strcmp(end, "h") == 0)
        mul = 3600000;
    else
        return -1;
    double ms = v * mul;
    if (ms < 1) return -1;
    *out = (int64_t)ms;
    return 0;
}

static int parse_count(const char *s, int64_t *out)
{
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < 1 || v > 1000000000LL) return -1;
    *out = v;
    return 0;
}

static int bad_usage(const char *fmt, const char *arg)
{
    fprintf(stderr, "fluxonctl: ");
    fprintf(stderr, fmt, arg ? arg : "");
    fprintf(stderr, "\n(see fluxonctl --help)\n");
    return 2;
}

/* Returns 0, or the exit code (2 usage; -1 help printed). */
static int parse_args(int argc, char **argv, opts *o)
{
    memset(o, 0, sizeof *o);
    const char *env = getenv("NATS_URL");
    o->server = env && *env ? env : CTL_DEFAULT_SERVER;
    o->timeout_ms = CTL_DEFAULT_TIMEOUT_MS;
    bool opts_done = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!opts_done && a[0] == '-' && a[1] != '\0') {
#define NEED_VALUE()                                                                             \
    do {                                                                                         \
        if (i + 1 >= argc) return bad_usage("option %s needs a value", a);                       \
    } while (0)
            if (strcmp(a, "--") == 0) {
                opts_done = true;
            } else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
                usage(stdout);
                return -1;
            } else if (strcmp(a, "-s") == 0 || strcmp(a, "--server") == 0) {
                NEED_VALUE();
                o->server = argv[++i];
            } else if (strcmp(a, "-t") == 0 || strcmp(a, "--timeout") == 0) {
                NEED_VALUE();
                if (parse_duration(argv[++i], &o->timeout_ms) != 0)
                    return bad_usage("invalid --timeout '%s'", argv[i]);
            } else if (strcmp(a, "--creds") == 0) {
                NEED_VALUE();
                o->creds = argv[++i];
            } else if (strcmp(a, "--json") == 0) {
                o->json = true;
            } else if (strcmp(a, "--ack") == 0) {
                o->ack = true;
            } else if (strcmp(a, "--api") == 0) {
                o->api = true;
            } else if (strcmp(a, "--nak") == 0) {
                o->nak = true;
            } else if (strcmp(a, "--quiet") == 0 || strcmp(a, "-q") == 0) {
                o->quiet = true;
            } else if (strcmp(a, "--count") == 0 || strcmp(a, "-n") == 0) {
                NEED_VALUE();
                if (parse_count(argv[++i], &o->count) != 0)
                    return bad_usage("invalid --count '%s' (1..1000000000)", argv[i]);
            } else if (strcmp(a, "--wait") == 0) {
                NEED_VALUE();
                if (parse_duration(argv[++i], &o->wait_ms) != 0)
                    return bad_usage("invalid --wait '%s'", argv[i]);
            } else if (strcmp(a, "--to") == 0) {
                NEED_VALUE();
                o->to = argv[++i];
            } else if (strcmp(a, "--max") == 0) {
                NEED_VALUE();
                if (parse_count(argv[++i], &o->max) != 0) return bad_usage("invalid --max '%s'", argv[i]);
            } else if (strcmp(a, "--rate") == 0) {
                NEED_VALUE();
                char rb[32];
                snprintf(rb, sizeof rb, "%s", argv[++i]);
                size_t rl = strlen(rb);
                if (rl > 2 && strcmp(rb + rl - 2, "/s") == 0) rb[rl - 2] = '\0';
                if (parse_count(rb, &o->rate) != 0) return bad_usage("invalid --rate '%s' (N or N/s)", argv[i]);
            } else if (strcmp(a, "--deadline") == 0) {
                NEED_VALUE();
                if (parse_duration(argv[++i], &o->deadline_ms) != 0 || o->deadline_ms > FX_REDRIVE_DEADLINE_CAP_MS)
                    return bad_usage("invalid --deadline '%s' (at most 24h)", argv[i]);
            } else if (strcmp(a, "--queue") == 0) {
                NEED_VALUE();
                o->queue = argv[++i];
            } else if (strcmp(a, "-H") == 0 || strcmp(a, "--header") == 0) {
                NEED_VALUE();
                const char *h = argv[++i];
                const char *colon = strchr(h, ':');
                if (!colon || colon == h) return bad_usage("invalid header '%s' (want Key:Value)", h);
                if (o->n_headers >= CTL_MAX_HEADERS) return bad_usage("too many headers%s", NULL);
                o->headers[o->n_headers++] = h;
            } else {
                return bad_usage("unknown option '%s'", a);
            }
#undef NEED_VALUE
        } else {
            if (o->n_args >= CTL_MAX_ARGS) return bad_usage("too many arguments%s", NULL);
            o->args[o->n_args++] = a;
        }
    }
    if (o->n_args == 0) {
        usage(stderr);
        return 2;
    }
    if (o->ack && o->nak) return bad_usage("--ack and --nak exclude each other%s", NULL);
    return 0;
}

static int nats_fail(const char *what, natsStatus s)
{
    fprintf(stderr, "fluxonctl: %s: %s\n", what, natsStatus_GetText(s));
    return 1;
}

static int connect_to(const opts *o, natsConnection **nc)
{
    natsOptions *no = NULL;
    char shown[512];
    fx_url_redact(o->server, shown, sizeof shown);
    /* cnats takes a URL's userinfo as written: the URL goes without it and the decoded user
     * and password (a user alone: a token) go apart (lease/fx_url.h). */
    char url[FX_URL_MAX + 1];
    fx_url cred;
    char why[160];
    if (fx_url_split_userinfo(o->server, url, sizeof url, &cred, why, sizeof why) != FX_URL_OK) {
        fprintf(stderr, "fluxonctl: --server %s: %s\n", shown, why);
        return 2;
    }
    natsStatus s = natsOptions_Create(&no);
    if (s == NATS_OK) s = natsOptions_SetURL(no, url);
    if (s == NATS_OK && cred.has_user)
        s = cred.has_password ? natsOptions_SetUserInfo(no, cred.user, cred.password)
                              : natsOptions_SetToken(no, cred.user);
    fx_url_wipe(&cred);
    explicit_bzero(url, sizeof url);
    if (s == NATS_OK) s = natsOptions_SetTimeout(no, o->timeout_ms);
    if (s == NATS_OK) s = natsOptions_SetName(no, "fluxonctl");
    if (s == NATS_OK) s = natsOptions_SetMaxReconnect(no, 10);
    if (s == NATS_OK && o->creds) s = natsOptions_SetUserCredentialsFromFiles(no, o->creds, NULL);
    if (s == NATS_OK) s = natsConnection_Connect(nc, no);
    natsOptions_Destroy(no);
    if (s != NATS_OK) {
        char what[600];
        snprintf(what, sizeof what, "cannot connect to %s", shown);
        return nats_fail(what, s);
    }
    return 0;
}

/* ---- JSON printing helpers ---------------------------------------------------------------- */

static void jnum(const cJSON *it, char *buf, size_t cap)
{
    if (!it || cJSON_IsNull(it)) {
        snprintf(buf, cap, "-");
    } else if (cJSON_IsNumber(it)) {
        double d = it->valuedouble;
        if (d == (double)(int64_t)d)
            snprintf(buf, cap, "%" PRId64, (int64_t)d);
        else
            snprintf(buf, cap, "%.17g", d);
    } else if (cJSON_IsString(it)) {
        snprintf(buf, cap, "%s", it->valuestring);
    } else if (cJSON_IsBool(it)) {
        snprintf(buf, cap, "%s", cJSON_IsTrue(it) ? "true" : "false");
    } else {
        snprintf(buf, cap, "?");
    }
}

static void print_id_list(const cJSON *arr)
{
    printf("[");
    int i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, arr)
    {
        char b[32];
        jnum(it, b, sizeof b);
        printf("%s%s", i++ ? ", " : "", b);
    }
    printf("]");
}

/* An {"error":{...}} answer: print it and return 1; else 0. */
static int api_error(const cJSON *root)
{
    const cJSON *err = cJSON_GetObjectItemCaseSensitive(root, "error");
    if (!err) return 0;
    const cJSON *code = cJSON_GetObjectItemCaseSensitive(err, "code");
    const cJSON *desc = cJSON_GetObjectItemCaseSensitive(err, "description");
    char cb[32];
    jnum(code, cb, sizeof cb);
    fprintf(stderr, "fluxonctl: error %s: %s\n", cb,
            cJSON_IsString(desc) ? desc->valuestring : (cJSON_IsString(err) ? err->valuestring : "?"));
    return 1;
}

static void print_pretty(const cJSON *root)
{
    char *p = cJSON_Print(root);
    if (p) {
        printf("%s\n", p);
        free(p);
    }
}

/* ---- commands ---------------------------------------------------------------------------------- */

/* Request subject (empty payload) and parse the JSON answer into *out. */
static int api_request(natsConnection *nc, const opts *o, const char *subject, cJSON **out)
{
    *out = NULL;
    natsMsg *reply = NULL;
    natsStatus s = natsConnection_Request(&reply, nc, subject, NULL, 0, o->timeout_ms);
    if (s == NATS_NO_RESPONDERS) {
        fprintf(stderr, "fluxonctl: no bridge answers %s (is fluxon-bridge running?)\n", subject);
        return 1;
    }
    if (s == NATS_TIMEOUT) {
        fprintf(stderr, "fluxonctl: %s: no answer within %" PRId64 " ms\n", subject, o->timeout_ms);
        return 1;
    }
    if (s != NATS_OK) return nats_fail(subject, s);
    int len = natsMsg_GetDataLength(reply);
    cJSON *root = cJSON_ParseWithLength(natsMsg_GetData(reply), (size_t)(len > 0 ? len : 0));
    if (!root) {
        fprintf(stderr, "fluxonctl: %s: answer is not JSON: %.*s\n", subject,
                len > 200 ? 200 : len, natsMsg_GetData(reply) ? natsMsg_GetData(reply) : "");
        natsMsg_Destroy(reply);
        return 1;
    }
    natsMsg_Destroy(reply);
    if (api_error(root)) {
        cJSON_Delete(root);
        return 1;
    }
    *out = root;
    return 0;
}

static bool valid_token(const char *t)
{
    if (!*t) return false;
    for (const char *p = t; *p; p++)
        if (*p == '.' || *p == '*' || *p == '>' || *p == ' ' || *p == '\t' || (unsigned char)*p < 0x20)
            return false;
    return true;
}

static bool valid_subject(const char *s, bool wildcards)
{
    if (!*s) return false;
    const char *p = s;
    for (;;) {
        const char *dot = strchr(p, '.');
        size_t n = dot ? (size_t)(dot - p) : strlen(p);
        if (n == 0) return false;
        for (size_t i = 0; i < n; i++) {
            unsigned char ch = (unsigned char)p[i];
            if (ch <= 0x20 || ch == 0x7f) return false;
            if ((ch == '*' || ch == '>') && (!wildcards || n != 1)) return false;
        }
        if (n == 1 && p[0] == '>' && dot) return false;
        if (!dot) return true;
        p = dot + 1;
    }
}

static int cmd_channels(natsConnection *nc, const opts *o)
{
    cJSON *root = NULL;
    int rc = api_request(nc, o, "$FLUXON.API.CHANNEL.LIST", &root);
    if (rc) return rc;
    if (o->json) {
        print_pretty(root);
        cJSON_Delete(root);
        return 0;
    }
    const cJSON *chans = cJSON_GetObjectItemCaseSensitive(root, "channels");
    if (!cJSON_IsArray(chans)) {
        fprintf(stderr, "fluxonctl: unexpected answer (no \"channels\")\n");
        cJSON_Delete(root);
        return 1;
    }
    int w = 7;
    const cJSON *c;
    cJSON_ArrayForEach(c, chans)
    {
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(c, "name");
        if (cJSON_IsString(n) && (int)strlen(n->valuestring) > w) w = (int)strlen(n->valuestring);
    }
    printf("%-*s  %8s  %10s\n", w, "CHANNEL", "MPMC", "BACKLOG");
    cJSON_ArrayForEach(c, chans)
    {
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(c, "name");
        char id[32], bl[32];
        jnum(cJSON_GetObjectItemCaseSensitive(c, "mpmc_id"), id, sizeof id);
        jnum(cJSON_GetObjectItemCaseSensitive(c, "backlog"), bl, sizeof bl);
        printf("%-*s  %8s  %10s\n", w, cJSON_IsString(n) ? n->valuestring : "?", id, bl);
    }
    cJSON_Delete(root);
    return 0;
}

static int cmd_info(natsConnection *nc, const opts *o, const char *chan)
{
    char subject[512];
    snprintf(subject, sizeof subject, "$FLUXON.API.CHANNEL.INFO.%s", chan);
    cJSON *root = NULL;
    int rc = api_request(nc, o, subject, &root);
    if (rc) return rc;
    if (o->json) {
        print_pretty(root);
        cJSON_Delete(root);
        return 0;
    }
    char b[64];
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(root, "name");
    printf("Channel:    %s\n", cJSON_IsString(name) ? name->valuestring : chan);
    jnum(cJSON_GetObjectItemCaseSensitive(root, "mpmc_id"), b, sizeof b);
    printf("MPMC id:    %s%s\n", b, strcmp(b, "-") == 0 ? " (not created yet)" : "");
    jnum(cJSON_GetObjectItemCaseSensitive(root, "backlog"), b, sizeof b);
    printf("Backlog:    %s\n", b);
    jnum(cJSON_GetObjectItemCaseSensitive(root, "delayed"), b, sizeof b);
    printf("Delayed:    %s (Nats-Schedule / Fluxon-Delay, waiting for their time)\n", b);
    jnum(cJSON_GetObjectItemCaseSensitive(root, "capacity"), b, sizeof b);
    printf("Capacity:   %s per sub-MPSC\n", b);
    jnum(cJSON_GetObjectItemCaseSensitive(root, "ttl_seconds"), b, sizeof b);
    printf("TTL:        %s s\n", b);
    const cJSON *mem = cJSON_GetObjectItemCaseSensitive(root, "members");
    printf("Producers:  ");
    print_id_list(cJSON_GetObjectItemCaseSensitive(mem, "producers"));
    printf("\nConsumers:  ");
    print_id_list(cJSON_GetObjectItemCaseSensitive(mem, "consumers"));
    printf("\n");
    const cJSON *subs = cJSON_GetObjectItemCaseSensitive(root, "sub_mpscs");
    int n = cJSON_GetArraySize(subs), ready = 0;
    const cJSON *sm;
    cJSON_ArrayForEach(sm, subs) if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(sm, "ready"))) ready++;
    printf("Sub-MPSCs:  %d (%d claimed)\n", n, ready);
    if (n > 0) {
        printf("  %8s  %-7s  %8s  %10s  %s\n", "CHAN", "CLAIMED", "OWNER", "BACKLOG",
               "PRODUCERS (pidx: produce/consume offset)");
        cJSON_ArrayForEach(sm, subs)
        {
            char ch[32], ow[32], bl[32];
            jnum(cJSON_GetObjectItemCaseSensitive(sm, "chan_id"), ch, sizeof ch);
            jnum(cJSON_GetObjectItemCaseSensitive(sm, "owner_member"), ow, sizeof ow);
            jnum(cJSON_GetObjectItemCaseSensitive(sm, "backlog"), bl, sizeof bl);
            bool r = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(sm, "ready"));
            printf("  %8s  %-7s  %8s  %10s  ", ch, r ? "yes" : "no", ow, bl);
            const cJSON *p;
            int k = 0;
            cJSON_ArrayForEach(p, cJSON_GetObjectItemCaseSensitive(sm, "producers"))
            {
                char pi[32], po[32], co[32];
                jnum(cJSON_GetObjectItemCaseSensitive(p, "pidx"), pi, sizeof pi);
                jnum(cJSON_GetObjectItemCaseSensitive(p, "produce_offset"), po, sizeof po);
                jnum(cJSON_GetObjectItemCaseSensitive(p, "consume_offset"), co, sizeof co);
                printf("%s%s: %s/%s", k++ ? ", " : "", pi, po, co);
            }
            printf("\n");
        }
    }
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(root, "truncated")))
        printf("(truncated: a listing bound was reached)\n");
    cJSON_Delete(root);
    return 0;
}

static int cmd_bridge_info(natsConnection *nc, const opts *o)
{
    cJSON *root = NULL;
    int rc = api_request(nc, o, "$FLUXON.API.INFO", &root);
    if (rc) return rc;
    print_pretty(root);
    cJSON_Delete(root);
    return 0;
}

static natsStatus add_headers(natsMsg *m, const opts *o)
{
    natsStatus s = NATS_OK;
    for (int i = 0; s == NATS_OK && i < o->n_headers; i++) {
        const char *h = o->headers[i];
        const char *colon = strchr(h, ':');
        char key[256];
        size_t kl = (size_t)(colon - h);
        if (kl >= sizeof key) kl = sizeof key - 1;
        memcpy(key, h, kl);
        key[kl] = '\0';
        const char *v = colon + 1;
        while (*v == ' ') v++;
        s = natsMsgHeader_Add(m, key, v);
    }
    return s;
}

static int cmd_pub(natsConnection *nc, const opts *o, const char *subject, const char *data)
{
    if (!valid_subject(subject, false))
        return bad_usage("invalid subject '%s' (no wildcards, no empty tokens)", subject);
    int64_t count = o->count > 0 ? o->count : 1;
    int dl = (int)strlen(data);
    for (int64_t i = 0; i < count && !g_stop; i++) {
        natsMsg *m = NULL;
        natsStatus s = natsMsg_Create(&m, subject, NULL, data, dl);
        if (s == NATS_OK) s = add_headers(m, o);
        if (s != NATS_OK) {
            natsMsg_Destroy(m);
            return nats_fail("message", s);
        }
        if (!o->ack) {
            s = natsConnection_PublishMsg(nc, m);
            natsMsg_Destroy(m);
            if (s != NATS_OK) return nats_fail("publish", s);
            continue;
        }
        natsMsg *reply = NULL;
        s = natsConnection_RequestMsg(&reply, nc, m, o->timeout_ms);
        natsMsg_Destroy(m);
        if (s == NATS_NO_RESPONDERS) {
            fprintf(stderr, "fluxonctl: nobody captures %s (no bridge with a matching channel?)\n",
                    subject);
            return 1;
        }
        if (s == NATS_TIMEOUT) {
            fprintf(stderr, "fluxonctl: no PubAck within %" PRId64 " ms\n", o->timeout_ms);
            return 1;
        }
        if (s != NATS_OK) return nats_fail("publish", s);
        int len = natsMsg_GetDataLength(reply);
        const char *d = natsMsg_GetData(reply);
        cJSON *root = cJSON_ParseWithLength(d ? d : "", (size_t)(len > 0 ? len : 0));
        int bad = root ? api_error(root) : 0;
        if (!bad) printf("%.*s\n", len > CTL_MAX_REPLY_PRINT ? CTL_MAX_REPLY_PRINT : len, d ? d : "");
        cJSON_Delete(root);
        natsMsg_Destroy(reply);
        if (bad) return 1;
    }
    if (g_stop) {
        fprintf(stderr, "fluxonctl: interrupted\n");
        return 1;
    }
    natsStatus s = natsConnection_FlushTimeout(nc, o->timeout_ms);
    if (s != NATS_OK) return nats_fail("flush", s);
    if (!o->ack)
        printf("published %" PRId64 " message%s to %s\n", count, count == 1 ? "" : "s", subject);
    return 0;
}

static void print_msg(natsMsg *m, int64_t n, bool quiet)
{
    const char *subj = natsMsg_GetSubject(m);
    const char *reply = natsMsg_GetReply(m);
    int len = natsMsg_GetDataLength(m);
    const char *data = natsMsg_GetData(m);
    if (quiet) {
        printf("[#%" PRId64 "] %s: %.*s\n", n, subj, len, data ? data : "");
        return;
    }
    printf("[#%" PRId64 "] Received on \"%s\"", n, subj);
    if (reply && *reply) printf(" with reply \"%s\"", reply);
    printf("\n");
    const char **keys = NULL;
    int nk = 0;
    if (natsMsgHeader_Keys(m, &keys, &nk) == NATS_OK) {
        for (int i = 0; i < nk; i++) {
            const char **vals = NULL;
            int nv = 0;
            if (natsMsgHeader_Values(m, keys[i], &vals, &nv) != NATS_OK) continue;
            for (int j = 0; j < nv; j++) printf("%s: %s\n", keys[i], vals[j]);
            free((void *)vals);
        }
        free((void *)keys);
        printf("\n");
    }
    fwrite(data ? data : "", 1, (size_t)(len > 0 ? len : 0), stdout);
    printf("\n\n");
}

static int cmd_sub(natsConnection *nc, const opts *o, const char *subject)
{
    if (!valid_subject(subject, true)) return bad_usage("invalid subject '%s'", subject);
    natsSubscription *sub = NULL;
    natsStatus s = o->queue ? natsConnection_QueueSubscribeSync(&sub, nc, subject, o->queue)
                            : natsConnection_SubscribeSync(&sub, nc, subject);
    if (s == NATS_OK) s = natsConnection_FlushTimeout(nc, o->timeout_ms);
    if (s != NATS_OK) {
        natsSubscription_Destroy(sub);
        return nats_fail("subscribe", s);
    }
    fprintf(stderr, "fluxonctl: subscribed to %s%s%s\n", subject, o->queue ? " queue " : "",
            o->queue ? o->queue : "");
    int rc = 0;
    int64_t got = 0, idle_ms = 0;
    while (!g_stop && (o->count == 0 || got < o->count)) {
        natsMsg *m = NULL;
        s = natsSubscription_NextMsg(&m, sub, CTL_POLL_MS);
        if (s == NATS_TIMEOUT) {
            idle_ms += CTL_POLL_MS;
            if (o->wait_ms > 0 && idle_ms >= o->wait_ms) {
                if (o->count > 0) {
                    fprintf(stderr, "fluxonctl: got %" PRId64 " of %" PRId64 " messages before --wait expired\n",
                            got, o->count);
                    rc = 1;
                }
                break;
            }
            continue;
        }
        if (s != NATS_OK) {
            if (s == NATS_SLOW_CONSUMER) {
                fprintf(stderr, "fluxonctl: slow consumer, messages dropped\n");
                continue;
            }
            rc = nats_fail("next message", s);
            break;
        }
        idle_ms = 0;
        got++;
        print_msg(m, got, o->quiet);
        const char *reply = natsMsg_GetReply(m);
        if ((o->ack || o->nak) && reply && *reply) {
            s = natsConnection_PublishString(nc, reply, o->ack ? "+ACK" : "-NAK");
            if (s != NATS_OK) fprintf(stderr, "fluxonctl: reply failed: %s\n", natsStatus_GetText(s));
        }
        natsMsg_Destroy(m);
        fflush(stdout);
    }
    natsSubscription_Unsubscribe(sub);
    natsSubscription_Destroy(sub);
    natsConnection_FlushTimeout(nc, o->timeout_ms);
    if (g_stop) fprintf(stderr, "fluxonctl: interrupted after %" PRId64 " message%s\n", got, got == 1 ? "" : "s");
    return rc;
}

/* ---- dead letters: dlq ls, redrive ------------------------------------------------------------ */

#define CTL_DLQ_LS_MAX_DEFAULT 100
#define CTL_DLQ_LS_MAX_CAP 10000
#define CTL_DLQ_IDLE_DEFAULT_MS 1000

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The DLQ's delivery prefix from $FLUXON.API.CHANNEL.INFO.<dlq> (it must be a dead-letter
 * channel this bridge serves). */
static int dlq_prefix(natsConnection *nc, const opts *o, const char *dlq, char *out, size_t cap)
{
    size_t n = strlen(dlq);
    if (!valid_token(dlq) || n <= 4 || strcmp(dlq + n - 4, "-dlq") != 0)
        return bad_usage("'%s' is not a dead-letter channel (<channel>-dlq)", dlq);
    char subject[300];
    snprintf(subject, sizeof subject, "$FLUXON.API.CHANNEL.INFO.%s", dlq);
    cJSON *root = NULL;
    int rc = api_request(nc, o, subject, &root);
    if (rc) return rc;
    const cJSON *dp = cJSON_GetObjectItemCaseSensitive(root, "deliver_prefix");
    const cJSON *isd = cJSON_GetObjectItemCaseSensitive(root, "dlq");
    if (!cJSON_IsString(dp) || !cJSON_IsTrue(isd) || strlen(dp->valuestring) >= cap) {
        fprintf(stderr, "fluxonctl: %s is not a dead-letter channel of the answering bridge\n", dlq);
        cJSON_Delete(root);
        return 1;
    }
    snprintf(out, cap, "%s", dp->valuestring);
    cJSON_Delete(root);
    return 0;
}

static const char *hdr_or(natsMsg *m, const char *k, const char *dflt)
{
    const char *v = NULL;
    return natsMsgHeader_Get(m, k, &v) == NATS_OK && v ? v : dflt;
}

static void nak_rest(natsConnection *nc, natsSubscription *sub)
{
    natsMsg *m = NULL;
    while (natsSubscription_NextMsg(&m, sub, 1) == NATS_OK) { /* back to the DLQ at once */
        const char *r = natsMsg_GetReply(m);
        if (r && *r) natsConnection_PublishString(nc, r, "-NAK");
        natsMsg_Destroy(m);
    }
}

/* fluxonctl dlq ls <dlq>: receive up to --max letters through the claim "fluxonctl-dlq" and print
 * why each died; every letter is NAKed back (it stays in the DLQ; its DLQ delivery count grows). */
static int cmd_dlq_ls(natsConnection *nc, const opts *o, const char *dlq)
{
    char prefix[256], subject[320];
    int rc = dlq_prefix(nc, o, dlq, prefix, sizeof prefix);
    if (rc) return rc;
    snprintf(subject, sizeof subject, "%s.fluxonctl-dlq", prefix);
    int64_t max = o->max ? o->max : CTL_DLQ_LS_MAX_DEFAULT;
    if (max > CTL_DLQ_LS_MAX_CAP) return bad_usage("--max above %s for dlq ls", "10000");
    int64_t idle = o->wait_ms ? o->wait_ms : CTL_DLQ_IDLE_DEFAULT_MS;
    natsSubscription *sub = NULL;
    natsStatus s = natsConnection_SubscribeSync(&sub, nc, subject);
    if (s == NATS_OK) s = natsSubscription_SetPendingLimits(sub, (int)CTL_DLQ_LS_MAX_CAP * 2, 256 << 20);
    if (s == NATS_OK) s = natsConnection_FlushTimeout(nc, o->timeout_ms);
    if (s != NATS_OK) {
        natsSubscription_Destroy(sub);
        return nats_fail("subscribe", s);
    }
    natsMsg **held = calloc((size_t)max, sizeof *held);
    if (!held) {
        natsSubscription_Destroy(sub);
        fprintf(stderr, "fluxonctl: out of memory\n");
        return 1;
    }
    int64_t n = 0, last = mono_ms();
    int64_t deadline = last + (o->deadline_ms ? o->deadline_ms : 30000);
    if (!o->json) printf("%-14s %-12s %-9s %-24s %s\n", "SEQ", "REASON", "ATTEMPTS", "SUBJECT", "DETAIL");
    while (!g_stop && n < max && mono_ms() < deadline) {
        natsMsg *m = NULL;
        s = natsSubscription_NextMsg(&m, sub, CTL_POLL_MS);
        if (s == NATS_TIMEOUT) {
            if (mono_ms() - last >= idle) break;
            continue;
        }
        if (s != NATS_OK) {
            if (s == NATS_SLOW_CONSUMER) continue;
            rc = nats_fail("next message", s);
            break;
        }
        last = mono_ms();
        const char *seq = hdr_or(m, "Fluxon-Seq", "?"), *reason = hdr_or(m, "Fluxon-Dead-Reason", "?");
        const char *att = hdr_or(m, "Fluxon-Dead-Delivered", "?"), *subj = hdr_or(m, "Fluxon-Subject", "?");
        const char *detail = hdr_or(m, "Fluxon-Dead-Detail", "");
        if (o->json) {
            cJSON *j = cJSON_CreateObject();
            if (j) {
                cJSON_AddStringToObject(j, "seq", seq);
                cJSON_AddStringToObject(j, "reason", reason);
                cJSON_AddStringToObject(j, "detail", detail);
                cJSON_AddStringToObject(j, "attempts", att);
                cJSON_AddStringToObject(j, "subject", subj);
                cJSON_AddStringToObject(j, "redriven", hdr_or(m, FX_REDRIVE_HDR, "0"));
                char *txt = cJSON_PrintUnformatted(j);
                if (txt) printf("%s\n", txt);
                free(txt);
                cJSON_Delete(j);
            }
        } else {
            printf("%-14s %-12s %-9s %-24s %s\n", seq, reason, att, subj, *detail ? detail : "-");
        }
        held[n++] = m;
    }
    for (int64_t i = 0; i < n; i++) {
        const char *r = natsMsg_GetReply(held[i]);
        if (r && *r) natsConnection_PublishString(nc, r, "-NAK");
        natsMsg_Destroy(held[i]);
    }
    free(held);
    nak_rest(nc, sub);
    natsSubscription_Unsubscribe(sub);
    natsSubscription_Destroy(sub);
    natsConnection_FlushTimeout(nc, o->timeout_ms);
    fprintf(stderr, "fluxonctl: %" PRId64 " dead letter%s listed from %s\n", n, n == 1 ? "" : "s", dlq);
    return rc;
}

/* Backlog of a channel (admin API), or -1. */
static int64_t dlq_backlog(natsConnection *nc, const opts *o, const char *dlq)
{
    char subject[300];
    snprintf(subject, sizeof subject, "$FLUXON.API.CHANNEL.INFO.%s", dlq);
    cJSON *root = NULL;
    if (api_request(nc, o, subject, &root)) return -1;
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(root, "backlog");
    int64_t v = cJSON_IsNumber(b) ? (int64_t)b->valuedouble : -1;
    cJSON_Delete(root);
    return v;
}

typedef struct ctl_rd {
    natsConnection *nc;
    const opts *o;
    const char *dlq;
} ctl_rd;

static int64_t ctl_rd_backlog(void *arg)
{
    ctl_rd *c = arg;
    return dlq_backlog(c->nc, c->o, c->dlq);
}

static bool ctl_rd_stopped(void *arg)
{
    (void)arg;
    return g_stop != 0;
}

static void ctl_rd_note(void *arg, const char *line)
{
    (void)arg;
    fprintf(stderr, "fluxonctl: redrive: %s\n", line);
}

/* --api: the same redrive run by a bridge ($FLUXON.API.CHANNEL.REDRIVE.<dlq>, redrive.h). */
static int redrive_via_api(natsConnection *nc, const opts *o, const char *dlq, const char *to,
                           int64_t max, int64_t rate, int64_t idle, int64_t deadline_ms)
{
    char subject[300], body[512];
    snprintf(subject, sizeof subject, "$FLUXON.API.CHANNEL.REDRIVE.%s", dlq);
    snprintf(body, sizeof body,
             "{\"to\":\"%s\",\"max\":%" PRId64 ",\"rate\":%" PRId64 ",\"wait_ms\":%" PRId64
             ",\"deadline_ms\":%" PRId64 "}", to, max, rate, idle, deadline_ms);
    natsMsg *r = NULL;
    /* the bridge answers when it is done: the deadline, plus its last answers */
    natsStatus s = natsConnection_RequestString(&r, nc, subject, body, deadline_ms + 4 * o->timeout_ms);
    if (s != NATS_OK) return nats_fail("redrive request", s);
    int len = natsMsg_GetDataLength(r);
    const char *data = natsMsg_GetData(r) ? natsMsg_GetData(r) : "";
    cJSON *j = cJSON_ParseWithLength(data, (size_t)(len > 0 ? len : 0));
    int rc = 1;
    if (j && !cJSON_GetObjectItemCaseSensitive(j, "error")) {
        const char *k[] = {"failed", "uncertain", "ack_unconfirmed"};
        rc = 0;
        for (size_t i = 0; i < 3; i++) {
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, k[i]);
            if (!cJSON_IsNumber(v) || v->valuedouble != 0) rc = 1;
        }
        if (cJSON_GetObjectItemCaseSensitive(j, "timed_out") || cJSON_GetObjectItemCaseSensitive(j, "interrupted")) rc = 1;
    }
    printf("%.*s\n", len > 0 ? len : 0, data);
    cJSON_Delete(j);
    natsMsg_Destroy(r);
    return rc;
}

/* fluxonctl redrive <dlq> [--to CH] [--max N] [--rate R] [--deadline D] [--wait D] [--api] */
static int cmd_redrive(natsConnection *nc, const opts *o, const char *dlq)
{
    char prefix[256], subject[320], to[200];
    int rc = dlq_prefix(nc, o, dlq, prefix, sizeof prefix);
    if (rc) return rc;
    if (o->to) {
        if (!valid_token(o->to) || strlen(o->to) >= sizeof to) return bad_usage("invalid --to '%s'", o->to);
        snprintf(to, sizeof to, "%s", o->to);
    } else {
        snprintf(to, sizeof to, "%.*s", (int)(strlen(dlq) - 4), dlq);
    }
    int64_t max = o->max ? o->max : FX_REDRIVE_MAX_DEFAULT;
    if (max > FX_REDRIVE_MAX_CAP) return bad_usage("--max above %s", "100000");
    int64_t rate = o->rate ? o->rate : FX_REDRIVE_RATE_DEFAULT;
    if (rate > FX_REDRIVE_RATE_CAP) return bad_usage("--rate above %s/s", "10000");
    int64_t idle = o->wait_ms ? o->wait_ms : FX_REDRIVE_IDLE_DEFAULT_MS;
    int64_t deadline_ms = o->deadline_ms ? o->deadline_ms : FX_REDRIVE_DEADLINE_DEFAULT_MS;
    if (o->api) return redrive_via_api(nc, o, dlq, to, max, rate, idle, deadline_ms);
    snprintf(subject, sizeof subject, "%s.fluxonctl-redrive", prefix);
    fprintf(stderr, "fluxonctl: redriving %s -> %s (at most %" PRId64 " letters, %" PRId64 "/s)\n", dlq, to, max, rate);
    ctl_rd c = {nc, o, dlq};
    fx_redrive_opts ro = {.dlq = dlq, .to = to, .subject = subject, .max = max, .rate = rate,
                          .idle_ms = idle, .deadline_ms = deadline_ms, .timeout_ms = o->timeout_ms,
                          .backlog = ctl_rd_backlog, .stopped = ctl_rd_stopped,
                          .note = ctl_rd_note, .arg = &c};
    fx_redrive_result r;
    natsStatus s = fx_redrive_run(nc, &ro, &r);
    if (s != NATS_OK) return nats_fail("subscribe", s);
    if (o->json) {
        char buf[640];
        if (fx_redrive_json(dlq, to, &r, buf, sizeof buf) > 0) printf("%s\n", buf);
    } else {
        printf("redrive %s -> %s: moved %" PRId64 ", failed %" PRId64 " (left in the DLQ), uncertain %" PRId64
               " (publish unanswered: may be in %s and still in the DLQ), ack unconfirmed %" PRId64
               " (in %s, may still be in the DLQ), skipped %" PRId64 ", in %" PRId64 " ms\n",
               dlq, to, r.moved, r.failed, r.uncertain, to, r.ack_unconfirmed, to, r.skipped, r.ms);
    }
    return r.failed || r.uncertain || r.ack_unconfirmed || r.timed_out || g_stop ? 1 : 0;
}

int main(int argc, char **argv)
{
    opts o;
    int rc = parse_args(argc, argv, &o);
    if (rc == -1) return 0;
    if (rc) return rc;
    const char *cmd = o.args[0];
    int want = -1; /* positional arguments after the command */
    if (strcmp(cmd, "channels") == 0 || strcmp(cmd, "bridge-info") == 0)
        want = 0;
    else if (strcmp(cmd, "info") == 0 || strcmp(cmd, "sub") == 0)
        want = 1;
    else if (strcmp(cmd, "pub") == 0)
        want = 2;
    else if (strcmp(cmd, "redrive") == 0)
        want = 1;
    else if (strcmp(cmd, "dlq") == 0) {
        if (o.n_args < 2 || strcmp(o.args[1], "ls") != 0) return bad_usage("dlq: want 'dlq ls <channel>-dlq'%s", NULL);
        want = 2;
    } else if (strcmp(cmd, "help") == 0) {
        usage(stdout);
        return 0;
    } else
        return bad_usage("unknown command '%s'", cmd);
    if (o.n_args - 1 != want) {
        fprintf(stderr, "fluxonctl: %s takes %d argument%s\n", cmd, want, want == 1 ? "" : "s");
        usage(stderr);
        return 2;
    }
    if (strcmp(cmd, "info") == 0 && !valid_token(o.args[1]))
        return bad_usage("invalid channel name '%s' (one subject token)", o.args[1]);

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);

    natsConnection *nc = NULL;
    rc = connect_to(&o, &nc);
    if (rc == 0) {
        if (strcmp(cmd, "channels") == 0)
            rc = cmd_channels(nc, &o);
        else if (strcmp(cmd, "bridge-info") == 0)
            rc = cmd_bridge_info(nc, &o);
        else if (strcmp(cmd, "info") == 0)
            rc = cmd_info(nc, &o, o.args[1]);
        else if (strcmp(cmd, "pub") == 0)
            rc = cmd_pub(nc, &o, o.args[1], o.args[2]);
        else if (strcmp(cmd, "redrive") == 0)
            rc = cmd_redrive(nc, &o, o.args[1]);
        else if (strcmp(cmd, "dlq") == 0)
            rc = cmd_dlq_ls(nc, &o, o.args[2]);
        else
            rc = cmd_sub(nc, &o, o.args[1]);
        natsConnection_Close(nc);
        natsConnection_Destroy(nc);
    }
    fflush(stdout);
    nats_CloseAndWait(2000);
    return rc;
}
