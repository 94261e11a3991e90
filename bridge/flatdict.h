/* flatdict.h -- the Fluxon FlatDict codec and the MQ message record built on it.
 *
 * Wire format (Fluxon's FlatDict, as the reference implementation writes it), little endian,
 * no padding:
 *     u32 count
 *     count x { u32 key_len, key bytes, u8 type, u32 val_len, value bytes }
 * Types: 1 int64 (val_len 8, two's complement), 3 float64 (val_len 8, IEEE-754 bits),
 *        4 string (bytes; UTF-8 is NOT enforced, so any NATS subject survives),
 *        5 bytes, 7 bool (val_len 1, value 0 or 1).
 * The MQ itself uses 1, 4 and 5; 3 and 7 are accepted for compatibility with the reference.
 * Rules enforced by both encoder and decoder: keys are 1..FX_FD_KEY_MAX bytes of valid UTF-8;
 * no duplicate keys; known types only, with their fixed lengths; the total encoding is at most
 * UINT32_MAX bytes. The decoder also rejects trailing bytes, a count or size over the caller's
 * limits, and never reads outside [buf, buf+len).
 *
 * Errors: decoding FX_EPROTO (detail says what and where); encoding FX_EINVAL for bad entries,
 * FX_ETOO_LARGE when the result would not fit (UINT32_MAX, or the caller's buffer for
 * *_encode_into), FX_ENOMEM.
 *
 * Ownership: entry keys/values given to encoders are borrowed for the call. Decoded entries
 * and message records are ZERO-COPY: their slices point into the decoded buffer, which the
 * caller must keep alive (and unchanged) while it uses them; nothing is allocated. Encoders
 * writing to fx_bytes allocate out->data with malloc (NUL-terminated one past len, like every
 * fx_bytes); the caller frees it (fx_bytes_free or free(out->data)); on error out is {NULL, 0}.
 * Thread rules: all functions are pure and thread-safe.
 */
#ifndef FX_BRIDGE_FLATDICT_H
#define FX_BRIDGE_FLATDICT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "etcd.h"
#include "fx_err.h"

typedef enum fx_fd_type {
    FX_FD_INT64 = 1,
    FX_FD_FLOAT64 = 3,
    FX_FD_STRING = 4,
    FX_FD_BYTES = 5,
    FX_FD_BOOL = 7,
} fx_fd_type;

#define FX_FD_KEY_MAX 1024          /* max key length in bytes */
#define FX_FD_HEADER_SIZE 4         /* u32 count */
#define FX_FD_ENTRY_OVERHEAD 9      /* u32 key_len + u8 type + u32 val_len */

typedef struct fx_fd_entry {
    fx_slice key;
    fx_fd_type type;
    fx_slice val;  /* STRING/BYTES: the value. Decode fills it for every type (the raw bytes). */
    int64_t i64;   /* INT64 */
    double f64;    /* FLOAT64 */
    bool b;        /* BOOL */
} fx_fd_entry;

/* Entry constructors (borrow their arguments). */
static inline fx_fd_entry fx_fd_int64(const char *key, int64_t v)
{
    return (fx_fd_entry){.key = FX_SLICE_STR(key), .type = FX_FD_INT64, .i64 = v};
}
static inline fx_fd_entry fx_fd_string(const char *key, fx_slice v)
{
    return (fx_fd_entry){.key = FX_SLICE_STR(key), .type = FX_FD_STRING, .val = v};
}
static inline fx_fd_entry fx_fd_bytes(const char *key, fx_slice v)
{
    return (fx_fd_entry){.key = FX_SLICE_STR(key), .type = FX_FD_BYTES, .val = v};
}

/* Exact encoded size of n entries into *out (validates the entries; FX_EINVAL/FX_ETOO_LARGE). */
fx_err fx_fd_encoded_size(const fx_fd_entry *e, size_t n, size_t *out);
/* Encode into buf[0..cap); *out_len = bytes written. FX_ETOO_LARGE if cap is too small (nothing
 * useful is written then). */
fx_err fx_fd_encode_into(const fx_fd_entry *e, size_t n, uint8_t *buf, size_t cap,
                         size_t *out_len);
/* Encode into a new buffer (see Ownership). */
fx_err fx_fd_encode(const fx_fd_entry *e, size_t n, fx_bytes *out);

/* Decode buf[0..len) into out[0..*out_n). Limits: len <= max_size and count <= max_entries;
 * out must have room for max_entries entries. On error *out_n is 0 and out's content is
 * unspecified. */
fx_err fx_fd_decode(const void *buf, size_t len, size_t max_entries, size_t max_size,
                    fx_fd_entry *out, size_t *out_n);
/* First entry with this key, or NULL. */
const fx_fd_entry *fx_fd_find(const fx_fd_entry *e, size_t n, const char *key);

/* ---- MQ message record ----------------------------------------------------------------------- *
 * A captured NATS message as one FlatDict with these fixed keys (in this order when encoded):
 *     "subject"    type 4  original subject, non-empty
 *     "headers"    type 5  the NATS header block as received ("NATS/1.0\r\n..."), empty if none
 *     "publish_ns" type 1  capture time, ns since the Unix epoch, >= 0
 *     "data"       type 5  the payload (may be empty)
 * The decoder requires subject, publish_ns and data; a missing headers entry means "none".
 * Entries with other keys are ignored (room for later fields), up to FX_MQ_MSG_MAX_ENTRIES in
 * total; the four known keys must have the types above. */
#define FX_MQ_MSG_KEY_SUBJECT "subject"
#define FX_MQ_MSG_KEY_HEADERS "headers"
#define FX_MQ_MSG_KEY_PUBLISH_NS "publish_ns"
#define FX_MQ_MSG_KEY_DATA "data"
#define FX_MQ_MSG_MAX_ENTRIES 16

typedef struct fx_mq_msg {
    fx_slice subject;
    fx_slice headers;
    int64_t publish_ns;
    fx_slice data;
} fx_mq_msg;

fx_err fx_mq_msg_encoded_size(const fx_mq_msg *m, size_t *out);
fx_err fx_mq_msg_encode_into(const fx_mq_msg *m, uint8_t *buf, size_t cap, size_t *out_len);
fx_err fx_mq_msg_encode(const fx_mq_msg *m, fx_bytes *out);
/* Zero-copy decode (slices point into buf). len must be <= max_size. */
fx_err fx_mq_msg_decode(const void *buf, size_t len, size_t max_size, fx_mq_msg *out);

#endif
