/* fxt_proxy.h -- a deterministic, filtering TCP proxy in front of etcd (test support).
 *
 * Relays HTTP/1.1 between a client under test and etcd. Requests (client -> etcd) are parsed
 * (header + Content-Length body); a request whose body matches an armed rule is not forwarded:
 * the proxy closes that connection instead, so exactly that etcd call fails (the client sees a
 * transport error). Responses (etcd -> client, streaming watches included) are relayed as raw
 * bytes. A rule is a set of up to FXT_PROXY_NEEDLES substrings that must ALL occur in the body;
 * a request is dropped when ANY armed rule matches (at most FXT_PROXY_RULES rules).
 *
 * etcd's JSON gateway carries keys in base64: fxt_proxy_b64() gives the needle of a whole key
 * (with padding, so it does not match a longer key whose length is not a multiple of 3).
 *
 * A hold rule makes matching requests wait instead (fxt_proxy_hold): a test counts how many
 * calls are in flight at once (fxt_proxy_held).
 *
 * Thread rules: start/stop from the test's main thread; the arm/disarm calls and the counters
 * may be used from any thread. Errors: fxt_proxy_start returns NULL (message on stderr).
 */
#ifndef FXT_PROXY_H
#define FXT_PROXY_H

#include <stddef.h>

#define FXT_PROXY_RULES 4
#define FXT_PROXY_NEEDLES 3
#define FXT_PROXY_NEEDLE_MAX 512

typedef struct fxt_proxy fxt_proxy;

/* Listen on a free loopback port and relay to 127.0.0.1:up_port. */
fxt_proxy *fxt_proxy_start(int up_port);
/* Stop accepting, cut every connection, join every thread, free. NULL is a no-op. */
void fxt_proxy_stop(fxt_proxy *px);
/* The endpoint to give the client under test: a 1-element array "http://127.0.0.1:<port>". */
const char *const *fxt_proxy_eps(fxt_proxy *px);

/* Replace every rule by one rule made of `n` needles (n == 0 or needles NULL: disarm all). */
void fxt_proxy_block(fxt_proxy *px, const char *const *needles, size_t n);
/* Add one rule (ignored with a message on stderr when FXT_PROXY_RULES are armed already). */
void fxt_proxy_block_add(fxt_proxy *px, const char *const *needles, size_t n);
/* One rule with the base64 of `key` (NULL: disarm all). */
void fxt_proxy_block_key(fxt_proxy *px, const char *key);
/* Requests dropped so far. */
int fxt_proxy_blocked(fxt_proxy *px);

/* Counted rules, checked before the rules above: the next `count` requests (count < 0: every one
 * until replaced) whose body holds ALL `n` needles fail in transit, in one of two ways the client
 * cannot tell apart (a transport error either way):
 *  FXT_PROXY_DROP_REQUEST  the request is not forwarded; the connection is closed.
 *  FXT_PROXY_DROP_ANSWER   the request is forwarded and etcd applies it; the proxy waits for the
 *                          first bytes of etcd's answer, drops them and closes the connection.
 * Replaces the previous counted rule; needles NULL or count 0 disarms it. */
typedef enum { FXT_PROXY_DROP_REQUEST = 0, FXT_PROXY_DROP_ANSWER = 1 } fxt_proxy_mode;
void fxt_proxy_fail_next(fxt_proxy *px, fxt_proxy_mode mode, const char *const *needles, size_t n,
                         int count);
/* Requests failed by the counted rules so far (each mode). */
int fxt_proxy_failed(fxt_proxy *px, fxt_proxy_mode mode);

/* Hold (instead of drop) every request matching one rule of `n` needles until the hold is
 * lifted: fxt_proxy_hold(px, NULL, 0) lets the held requests through and disarms it (so does
 * fxt_proxy_stop). Separate from the drop rules. */
void fxt_proxy_hold(fxt_proxy *px, const char *const *needles, size_t n);
/* Requests held right now, and the most held at once since start. */
int fxt_proxy_held(fxt_proxy *px);
int fxt_proxy_held_peak(fxt_proxy *px);

/* Request accounting (benchmarks): with a classifier set, every request the proxy forwards gets a
 * class 0..FXT_PROXY_CLASSES-1 from fn(request line, body) (out of range: not counted), and the
 * proxy counts per class the requests, their bytes (headers + body) and the bytes etcd sends back
 * on that connection until its next request (so a watch or keepalive stream's answers count for
 * the request that opened it). fn runs on the proxy's relay threads, concurrently: it must be
 * pure. Set it before the client connects; the counters may be read from any thread. */
#define FXT_PROXY_CLASSES 16
typedef int (*fxt_proxy_classify_fn)(const char *line, size_t line_len, const char *body,
                                     size_t body_len);
void fxt_proxy_set_classifier(fxt_proxy *px, fxt_proxy_classify_fn fn);
typedef struct fxt_proxy_class_stats {
    long long reqs, req_bytes, resp_bytes;
} fxt_proxy_class_stats;
/* Counters of class cls so far (zeros for a class out of range). */
void fxt_proxy_class_stats_get(fxt_proxy *px, int cls, fxt_proxy_class_stats *out);
/* Decode standard base64 (padding optional; stops at the first other byte) into out; returns the
 * decoded length (at most cap - 1; out is NUL-terminated). */
size_t fxt_proxy_unb64(const char *in, size_t len, char *out, size_t cap);

/* Base64 of a string into out (cap >= 4/3 strlen + 5). */
void fxt_proxy_b64(const char *s, char *out, size_t cap);

#endif
