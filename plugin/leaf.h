/* leaf.h -- a minimal NATS leafnode publisher (nats-server 2.9 leafnode protocol, plain TCP).
 *
 * Why: nats-server refuses a CLIENT connection's publish whose reply subject starts with
 * "$JS.ACK." ("Publish Violation", reserved reply). A LEAFNODE connection is not subject to that
 * check, so the bridge publishes its explicit-ack deliveries over a leaf connection to the local
 * server's leafnode listener, with the true "$JS.ACK.FLUXON...." reply (deploy/README.md "Ack reply subjects").
 *
 * Wire (we are the soliciting side; server/leafnode.go, server/parser.go of nats-server 2.9):
 *   server -> INFO {...}                       (first line; tls_required, headers, max_payload)
 *   us     -> CONNECT {"name":..,"tls_required":false,"headers":true[,"user":..,"pass":..]}
 *             PING                             (the PONG confirms the CONNECT was processed)
 *   server -> INFO {...connect_info...}, LS+ <subject> [<queue> <weight>], LS- <subject>
 *             [<queue>], PONG                  (no account token on a leaf connection)
 *   either -> PING / PONG                      (keepalive both ways)
 *   us     -> LMSG <subject> [<reply>] <size>\r\n<payload>\r\n                (no headers)
 *             HMSG <subject> [<reply>] <hdr size> <total size>\r\n<hdr><payload>\r\n
 *             and, when queue groups on the hub are interested in <subject>:
 *             LMSG <subject> + <reply> <q1> <q2>... <size>   (or "| <q1>..." without a reply)
 *             HMSG <subject> + <reply> <q1>... <hdr size> <total size>   (or "| <q1>...")
 * The server delivers a leaf message to its queue subscribers only when the frame names their
 * queue groups (server/leafnode.go processLeafMsgArgs / processLeafHeaderMsgArgs, client.go
 * processMsgResults). So the reader keeps the queue interest of the LS+/LS- lines: (subject
 * pattern, queue, weight), weight replaced by each LS+, removed by LS-; at most 65,536
 * entries (more: logged once, counted, and messages on them carry no queue name), cleared on
 * reconnect (the server sends its interest again). A publish names the distinct queues of the
 * entries whose pattern matches its subject, at most FX_LEAF_MAX_QUEUES_PER_MSG and within
 * the 4096-byte control line (more: counted in queue_truncated). A message published before
 * the LS+ of a new queue subscriber arrives does not reach it (like any interest race).
 * Plain LS+/LS- lines are kept as a set of subjects (same bound) for fx_leaf_has_interest.
 * We never send LS+, so the server never sends us messages; LMSG/HMSG from the server are
 * skipped anyway. There is no no-responders status on a leaf connection.
 *
 * Threads: one I/O thread (connect with timeout, handshake, reads, PONG answers, keepalive PINGs,
 * flushing what the socket did not take, reconnect with bounded backoff). fx_leaf_publish may be
 * called from any number of threads: it appends the frame to a bounded write buffer under a
 * mutex and writes it to the socket at once (non-blocking, like cnats' SendAsap; a thread that
 * corked the leaf writes once per batch, fx_leaf_cork); what does not fit in the socket is
 * flushed by the I/O thread. Publishing while disconnected, or with the
 * buffer full, fails at once (the caller retries later): nothing is buffered across reconnects.
 * fx_leaf_stop interrupts every wait (connect, handshake, backoff, poll) through an eventfd.
 *
 * Credentials (user:password in the URL) go only into the CONNECT line; they are never logged
 * and are wiped when freed. TLS and nkey/JWT authentication are not supported.
 */
#ifndef FX_PLUGIN_LEAF_H
#define FX_PLUGIN_LEAF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fx_err.h"

#define FX_LEAF_DEFAULT_PORT 7422
#define FX_LEAF_MAX_QUEUES_PER_MSG 64

typedef struct fx_leaf_url {
    char host[256]; /* name or address; IPv6 without brackets */
    int port;       /* FX_LEAF_DEFAULT_PORT when the URL has none */
    bool has_user;
    char user[256]; /* percent-decoded */
    char pass[256];
} fx_leaf_url;

/* Parse "nats://[user[:password]@]host[:port][/]" (one URL; "[v6]" hosts; port 1..65535).
 * Returns 0, or -1 with a reason in err that never quotes the URL (it may hold a password). */
int fx_leaf_url_parse(const char *url, fx_leaf_url *out, char *err, size_t errlen);

typedef struct fx_leaf_opts {
    const char *url;              /* required */
    const char *name;             /* CONNECT "name"; the server replaces an older leaf of the
                                     same name (use one name per process); default "fluxon" */
    int64_t connect_timeout_ms;   /* TCP connect + handshake; 0: 2000 */
    int64_t ping_interval_ms;     /* our keepalive PINGs; 0: 10000 */
    int max_pings_out;            /* unanswered PINGs before the connection is stale; 0: 3 */
    int64_t reconnect_min_ms;     /* backoff after a failure, doubling; 0: 100 */
    int64_t reconnect_max_ms;     /* 0: 2000 */
    size_t max_pending_bytes;     /* write buffer bound; 0: 8 MiB */
} fx_leaf_opts;

typedef struct fx_leaf fx_leaf;

typedef struct fx_leaf_stats {
    uint64_t connects;     /* successful handshakes */
    uint64_t msgs, bytes;  /* frames accepted by fx_leaf_publish */
    uint64_t writes;       /* send() calls that wrote buffered bytes (frames and PINGs/PONGs) */
    uint64_t server_pings; /* PINGs from the server answered */
    uint64_t pongs;        /* PONGs received (answers to our PINGs) */
    uint64_t server_errors;/* -ERR lines received */
    uint64_t queue_entries;   /* (subject, queue) pairs known from LS+ now */
    uint64_t queue_dropped;   /* LS+ not recorded: over the bound (or out of memory) */
    uint64_t queue_truncated; /* messages that could not name every matching queue group */
    uint64_t queue_bad_lines; /* malformed LS+/LS- lines ignored */
} fx_leaf_stats;

/* Validates the options (no I/O, no thread). */
fx_err fx_leaf_new(const fx_leaf_opts *o, fx_leaf **out);
/* Start the I/O thread; connecting happens in the background. */
fx_err fx_leaf_start(fx_leaf *l);
bool fx_leaf_connected(fx_leaf *l);
/* Does the hub have a subscriber (plain or queue, any subject pattern) for `subject` now, as
 * its LS+/LS- lines said? false while disconnected. A leaf message on a subject without one is
 * dropped by the server without a word (no no-responders on a leaf connection), so a publisher
 * that must know whether a delivery could be received asks this first. Past the entry bound
 * every subject answers true. Thread-safe. */
bool fx_leaf_has_interest(fx_leaf *l, const char *subject);
/* "connected" or why not (no credentials). */
void fx_leaf_status(fx_leaf *l, char *buf, size_t cap);
void fx_leaf_get_stats(fx_leaf *l, fx_leaf_stats *out);

/* Publish one message. hdr/hlen: a NATS header block ("NATS/1.0\r\n...\r\n\r\n") or NULL/0;
 * reply may be NULL or "". Subjects must be non-empty and free of whitespace and control bytes.
 * Errors: FX_EUNAVAIL (not connected, or the write failed: the message is not sent),
 * FX_EFULL (write buffer full), FX_ETOO_LARGE (over the server's max_payload), FX_EINVAL.
 * Thread-safe; never blocks on the network. */
fx_err fx_leaf_publish(fx_leaf *l, const char *subject, const char *reply, const void *hdr,
                       size_t hlen, const void *data, size_t dlen);
/* Batching (one send for a round of publishes instead of one per message): between
 * fx_leaf_cork(l) and fx_leaf_uncork(l) on one thread, that thread's fx_leaf_publish calls only
 * append to the write buffer (until CORK_FLUSH_BYTES, 32 KiB, are pending: then it sends as
 * usual); fx_leaf_uncork sends what is pending. Frames of other threads are not held (and a
 * publish of another thread sends the corked ones too). Calls nest (counted); a thread corks one
 * leaf at a time (corking another uncorks the first). The caller must uncork before it waits for
 * anything: corked frames wait for it. Thread-local state: no locking between threads. */
void fx_leaf_cork(fx_leaf *l);
void fx_leaf_uncork(fx_leaf *l);
/* The queue names (space-separated, in buf) a message on `subject` would carry now; returns
 * their count. For diagnostics and tests (e.g. to wait until an LS+ / LS- was processed). */
int fx_leaf_queue_names(fx_leaf *l, const char *subject, char *buf, size_t cap);
/* PING and wait for its PONG: everything published before was processed by the server.
 * FX_EUNAVAIL when disconnected (before or during), FX_ETIMEDOUT, FX_ECANCELED on stop. */
fx_err fx_leaf_flush(fx_leaf *l, int64_t timeout_ms);
/* Stop the I/O thread and close the connection (prompt: interrupts every wait). Idempotent. */
void fx_leaf_stop(fx_leaf *l);
void fx_leaf_free(fx_leaf *l);

/* For tests and fuzzing (tests/fuzz/fuzz_leaf.c): process data[0..len) as if the server had sent
 * it on a fresh connection (the first line must be INFO), through the same line reader as the
 * I/O thread. Only on a leaf that was never started (no socket: a PING, whose PONG cannot be
 * written, ends the input like a full write buffer). Returns 0, or -1 once a line was refused as
 * the connection would be dropped (the reader is then reset for a new connection). */
int fx_leaf_feed(fx_leaf *l, const void *data, size_t len);

#endif
