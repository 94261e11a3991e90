/* leaf_proto.h -- the reader of what a nats-server leafnode listener sends (leaf.h has the wire),
 * with no I/O: feed it bytes as they arrive, take parsed frames out (the hiredis redisReader
 * style: fx_lp_feed, then fx_lp_next until it says "need more").
 *
 * Frames (one protocol line each, CRLF or LF terminated, op case-insensitive):
 *   INFO <json>                       arg: the JSON text (not parsed here)
 *   PING, PONG, +OK
 *   -ERR <text>                       arg: the text as sent (quotes included)
 *   LS+ <subject> [<queue> <weight>]  subject, queue (NULL without), weight (0 without)
 *   LS- <subject> [<queue>]           subject, queue (NULL without)
 *     A line with the wrong number of tokens, a name longer than FX_LP_NAME_MAX or with a
 *     control byte, or a weight that is not a decimal number is returned with `malformed` set
 *     (the connection goes on; the caller counts it).
 *   LMSG/HMSG <args> <size>           msg_size: the last token; the reader then skips the
 *                                     payload and its CRLF (the caller never subscribed).
 * Errors (fx_lp_next returns -1 and the reader stays failed until fx_lp_reset): a line longer
 * than max_line bytes without its end, a NUL byte in a line, an unknown op, an LMSG/HMSG without a valid size (a
 * decimal of at most 10 digits, at most 1 GiB) or whose payload is not followed by CRLF.
 * fx_lp_error gives the reason (never more than 16 bytes of the offending input, sanitised).
 *
 * Memory: the reader keeps the bytes of at most one incomplete line (plus what one feed brought);
 * frame pointers point into it and stay valid until the next fx_lp_feed / fx_lp_next /
 * fx_lp_reset. Not thread-safe (one reader per connection, one thread).
 */
#ifndef FX_PLUGIN_LEAF_PROTO_H
#define FX_PLUGIN_LEAF_PROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define FX_LP_NAME_MAX 1024     /* longest subject / queue name in LS+/LS- */
#define FX_LP_MSG_MAX (1u << 30) /* largest LMSG/HMSG payload skipped */

typedef enum fx_lp_kind {
    FX_LP_INFO = 1,
    FX_LP_PING,
    FX_LP_PONG,
    FX_LP_OK,
    FX_LP_ERR,
    FX_LP_LS_ADD,
    FX_LP_LS_DEL,
    FX_LP_MSG,
} fx_lp_kind;

typedef struct fx_lp_frame {
    fx_lp_kind kind;
    const char *arg;     /* after the op and its blanks, NUL-terminated ("" when none); for
                            LS+/LS- split into the tokens below (arg_len is the line's) */
    size_t arg_len;
    /* LS+ / LS- */
    bool malformed;
    const char *subject; /* NUL-terminated */
    const char *queue;   /* NULL when the line names none */
    int64_t weight;      /* LS+ with a queue: as sent (0 allowed); else 0 */
    /* LMSG / HMSG */
    uint64_t msg_size;
} fx_lp_frame;

typedef struct fx_lp_reader fx_lp_reader;

/* max_line: the longest line accepted (without its CRLF), >= 64. NULL when out of memory. */
fx_lp_reader *fx_lp_reader_new(size_t max_line);
void fx_lp_reader_free(fx_lp_reader *r);
/* Append bytes. Returns 0, or -1 (out of memory, or the reader has failed). */
int fx_lp_feed(fx_lp_reader *r, const void *buf, size_t len);
/* The next frame: 1 (frame in *out), 0 (need more bytes), -1 (protocol error: fx_lp_error). */
int fx_lp_next(fx_lp_reader *r, fx_lp_frame *out);
const char *fx_lp_error(const fx_lp_reader *r);
/* Forget every byte and the error (a new connection). */
void fx_lp_reset(fx_lp_reader *r);
/* Bytes held (an incomplete line, unparsed frames); for tests. */
size_t fx_lp_buffered(const fx_lp_reader *r);

#endif
