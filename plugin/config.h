/* config.h -- fluxon-bridge configuration (JSON, deploy/README.md "Configuration fields"): defaults in one place, full
 * validation before anything starts, errors that name the field ("channels[1].subjects[0]: ...").
 *
 * Ownership: fx_config owns every string and array in it; free with fx_config_free().
 * Thread rules: load/free from one thread; a loaded config is read-only and may be shared.
 * Secrets (passwords, tokens) are held but never printed: error messages never quote values,
 * and every string is wiped before it is freed.
 */
#ifndef FX_PLUGIN_CONFIG_H
#define FX_PLUGIN_CONFIG_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum { FX_ACK_EXPLICIT = 0, FX_ACK_NONE = 1 } fx_ack_mode;

#define FX_CFG_MAX_BACKOFF 16

/* Per-channel settings; `defaults` holds the same fields. Durations are in milliseconds. */
typedef struct fx_chan_settings {
    int64_t ttl_seconds;     /* default 90, >= 2 (etcd minimum) */
    int64_t capacity;        /* default 100000, >= 1 */
    fx_ack_mode ack;         /* default explicit */
    int64_t ack_wait_ms;     /* default 30 s, >= 100 ms */
    int64_t max_deliver;     /* default 5, >= 1 */
    int64_t max_ack_pending; /* default 1000, >= 1 */
    int64_t backoff_ms[FX_CFG_MAX_BACKOFF]; /* redelivery delays; default {1 s, 5 s} */
    size_t n_backoff;
    /* default 0 (at once, JetStream's NAK): delay of a NAK without one when backoff is empty;
     * <= 24 h */
    int64_t nak_delay_ms;
    int64_t release_after_ms; /* default 5 s */
    int64_t interest_poll_ms; /* default 1 s, >= 50 ms */
    /* default 7 d, >= 2 s and >= ttl_seconds, <= etcd's MaxLeaseTTL; whole seconds (rounded up):
     * TTL of the channel's data leases: how long its messages outlive the last running bridge. */
    int64_t retention_ms;
    int64_t full_wait_ms;     /* default 0: a publish to a full channel fails at once (503,
                                 err_code 10077); > 0: wait up to this long for room (<= 60 s) */
    int64_t duplicate_window_ms; /* default 2 min: Nats-Msg-Id dedup window; 0 disables dedup */
    /* The window's bound per bridge (bridge/dedup.h): at most this many ids (default 100,000,
     * 1,000..10,000,000) and bytes of etcd footprint (1 MiB..1 GiB; all channels of a bridge
     * together at most FX_CFG_DEDUP_BYTES_ALL; unset: an equal share of what the channels that
     * set it leave, at most FX_CFG_DEDUP_BYTES_AUTO_MAX); past it the oldest ids are forgotten
     * early (the window shortens, WARN and fluxon_dedup_forgotten_total). */
    int64_t duplicate_max_ids;
    int64_t duplicate_max_bytes;
    /* default 1 d: the longest delay a publish may ask for (Nats-Schedule / Fluxon-Delay);
     * longer -> refused (400). 0 refuses every delay. Applied as min(max_delay, retention). */
    int64_t max_delay_ms;
} fx_chan_settings;

#define FX_CFG_DEDUP_BYTES_ALL (512LL << 20)     /* a quarter of etcd's default 2 GiB quota */
#define FX_CFG_DEDUP_BYTES_AUTO_MAX (32LL << 20) /* duplicate_max_bytes when unset, at most */

typedef struct fx_chan_config {
    char *name;            /* single subject token; also the MPMC unique key */
    char **subjects;       /* capture subjects (wildcards allowed) */
    size_t n_subjects;
    char *deliver_prefix;  /* literal subject prefix; deliveries go to <deliver_prefix>.<name> */
    fx_chan_settings s;    /* defaults overlaid with the channel's overrides */
    bool is_dlq;           /* generated: the <name>-dlq channel of another channel */
} fx_chan_config;

typedef struct fx_config {
    char *name;            /* bridge id (single token); default "<host>-<pid>" sanitised */
    struct {
        char *url;         /* default nats://127.0.0.1:4222 */
        char *monitor_url; /* default http://127.0.0.1:8222 */
        char *account;     /* default "$G" */
        char *leaf_url;    /* optional "nats://[user:pass@]host:port" of the server's leafnode
                              listener: explicit-ack deliveries then go over a leaf connection
                              with true "$JS.ACK." replies (leaf.h); NULL: over the client
                              connection with "$FLUXON.ACK." replies */
        char *user, *password, *token, *creds_file, *nkey_seed_file;
        char *ca_file, *cert_file, *key_file;
        bool tls_insecure;
        bool leaf_pubacks; /* with leaf_url: PubAcks go over the leaf connection while it is up,
                              a stored batch's in one write (default false: the leaf user then
                              needs publish rights on the publishers' reply subjects) */
    } nats;
    struct {
        char **endpoints;  /* default {"http://127.0.0.1:2379"} */
        size_t n_endpoints;
        char *prefix;      /* default "/fluxon" */
        char *username, *password;
        char *ca_file, *cert_file, *key_file;
        bool tls_insecure;
        char *transport;   /* "grpc" (default): KV calls over etcd's gRPC API; "json": all over
                              the JSON gateway. Leases, auth, status and watches use the
                              gateway either way (lease/etcd.h) */
    } etcd;
    struct {
        char *backend;     /* "etcd" (default) or "redis" */
        char **endpoints;  /* etcd backend; default: the etcd endpoints */
        size_t n_endpoints;
        char *url;         /* redis backend (required there): redis://[user:pass@]host:port[/db]
                            * or unix:/path[?db=N]; may hold a password: never printed */
        bool require_fsync; /* redis: refuse to start unless appendfsync always (with AOF on) */
        int64_t timeout_ms; /* redis: deadline of each KV call (a publish's put), default 5000 */
        int64_t min_replicas; /* redis: a put (so a PubAck) waits for that many replicas (WAIT) */
    } kv;
    struct {
        char *listen;      /* "127.0.0.1:8080"; NULL/"" disables HTTP */
    } http;
    struct {
        bool api;          /* default true: answer the JetStream API subset (jsapi.h) */
        char *domain;      /* optional single token: answer $JS.<domain>.API instead of $JS.API */
    } jetstream;
    fx_chan_settings defaults;
    fx_chan_config *channels; /* configured channels, each followed by nothing: DLQ channels are */
    size_t n_channels;        /* appended after the configured ones (is_dlq = true) */
    atomic_int refs;          /* shared configs only (fx_config_share); 0 otherwise */
} fx_config;

/* Parse and validate. On failure returns -1 and writes "field: reason" into err. On success
 * returns 0 and *out owns the result. Checks: unknown keys (at every level), types, ranges,
 * durations ("250ms", "30s", "5m", "1h" or a number of seconds), names as single tokens, subject
 * syntax, duplicate channel names, overlapping capture subjects across channels, a capture
 * subject overlapping any delivery prefix (<deliver_prefix>.> and the -dlq prefixes), duplicate
 * deliver prefixes. DLQ channels "<name>-dlq" with deliver prefix "<deliver_prefix>-dlq" and no
 * capture subjects are generated for channels with ack explicit. */
int fx_config_parse(const char *json, size_t len, fx_config *out, char *err, size_t errlen);
int fx_config_load_file(const char *path, fx_config *out, char *err, size_t errlen);
void fx_config_free(fx_config *c);
/* Shared configurations (a running daemon's current one and every reader that may outlive a
 * reload): c is heap-allocated and owned by the caller; fx_config_share gives it one reference
 * (the caller's). fx_config_ref adds one (returns c); fx_config_unref drops one and, on the last,
 * runs fx_config_free and frees c. Any thread. NULL is ignored. */
void fx_config_share(fx_config *c);
fx_config *fx_config_ref(fx_config *c);
void fx_config_unref(fx_config *c);
/* Parse a duration ("250ms", "30s", "5m", "1h", or a JSON number of seconds given as text). */
int fx_parse_duration_ms(const char *s, int64_t *out_ms);
/* Find a channel by name (configured or DLQ); NULL if none. */
const fx_chan_config *fx_config_channel(const fx_config *c, const char *name);

#endif
