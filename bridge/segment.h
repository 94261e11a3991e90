/* segment.h -- the payload segment: one KV value holding one producer batch back to back
 * (docs/ARCHITECTURE.md, "One message"). A segment of n messages with ids [first, last] is stored under the payload
 * key of its LAST id, so
 *   - the segment holding id x is the first payload key >= key(x) (one range read, limit 1);
 *   - delete_range(key(0), key(c)) removes exactly the segments whose messages are all < c;
 *   - the produce offset (last written id) is always the key of the newest segment.
 *
 * Wire format, big endian, no padding:
 *     "FXS1"                        magic (4 bytes)
 *     u32 n                         number of messages, 1..FX_SEG_MAX_MSGS
 *     n x { u32 len, len bytes }    the messages, in id order
 * The decoder validates the whole value before anything is read from it: magic, n in range,
 * every length inside the buffer, no trailing bytes. Nothing is allocated by either side.
 *
 * Thread rules: pure functions, thread-safe. Ownership: slices point into the caller's buffer.
 */
#ifndef FX_BRIDGE_SEGMENT_H
#define FX_BRIDGE_SEGMENT_H

#include <stddef.h>
#include <stdint.h>

#include "etcd.h"
#include "fx_err.h"

#define FX_SEG_MAX_MSGS 4096
#define FX_SEG_HDR 8u     /* magic + n */
#define FX_SEG_PER_MSG 4u /* length prefix of each message */

/* Bytes needed to encode vals[0..n). */
size_t fx_seg_size(const fx_slice *vals, size_t n);
/* Encode vals[0..n) (1 <= n <= FX_SEG_MAX_MSGS) into out (cap >= fx_seg_size). Returns the
 * length written, or 0 on bad arguments (n out of range, a value over UINT32_MAX, cap short). */
size_t fx_seg_encode(const fx_slice *vals, size_t n, uint8_t *out, size_t cap);

/* A validated segment; fx_seg_next walks it. */
typedef struct fx_seg_iter {
    const uint8_t *p, *end;
    uint32_t n;    /* messages in the segment */
    uint32_t left; /* messages not yet returned */
} fx_seg_iter;

/* Validate data[0..len) as a whole segment. FX_EPROTO (detail: what is wrong) on anything else. */
fx_err fx_seg_open(const void *data, size_t len, fx_seg_iter *it);
/* Next message; 0 when none is left. */
int fx_seg_next(fx_seg_iter *it, fx_slice *msg);

#endif
