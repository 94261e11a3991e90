/* hdr.h -- the stored NATS header block: its form, and the codec between it, cnats messages and
 * the header block of a delivery.
 *
 * Form (the "headers" entry of a stored bridge/flatdict.h fx_mq_msg): a canonical NATS header
 * block rebuilt from cnats' parsed headers: "NATS/1.0\r\n" + one "Key: Value\r\n" line per value
 * (keys in cnats order, values in arrival order) + "\r\n"; empty when the message had none.
 * Dead letters carry the original block plus Fluxon-Dead-Reason, Fluxon-Dead-Delivered and
 * Fluxon-Dead-Id lines (dm_hdr_append).
 *
 * Reading a block (dm_hdr_delivery, dm_hdr_apply, and dm_hdr_iter_* for on_capture, capture.c):
 * the lines after the status line, up to the empty line (or the end of the block); a line
 * without ':' or with an empty key is skipped; the value is what follows ':' without its
 * leading spaces and tabs. A stored block is input from Fluxon MQ: any bytes are accepted
 * (tests/fuzz/fuzz_hdr.c), nothing is read outside the block.
 *
 * Ownership: a block passed in (fx_slice) is borrowed and never kept. dm_hdr_from_msg and
 * dm_hdr_append return a new malloc'd, NUL-terminated block (*out; the caller frees it);
 * dm_hdr_delivery writes into a caller-owned buffer it grows with realloc.
 * Threads: no state, no lock: any thread (on a natsMsg that thread owns).
 * Bounds: none of its own; the output is at most the input plus the pairs given (sizes are
 * computed before writing), and callers bound the input (FX_DM_MAX_MSG_BYTES, dmctx.h).
 */
#ifndef FX_PLUGIN_HDR_H
#define FX_PLUGIN_HDR_H

#include <nats/nats.h>
#include <stdbool.h>
#include <stddef.h>

#include "etcd.h" /* fx_slice */
#include "fx_err.h"

/* The header block of m ("NATS/1.0" + its lines + the empty line) into *out (malloc'd,
 * NUL-terminated, length in *out_len); *out NULL and *out_len 0 when m has no header. */
fx_err dm_hdr_from_msg(natsMsg *m, char **out, size_t *out_len);
/* Append "Key: Value\r\n" lines (kv: n_pairs key, value pairs) to a block (creating it when
 * empty); out is malloc'd and NUL-terminated. */
fx_err dm_hdr_append(fx_slice block, const char *const *kv, size_t n_pairs, char **out,
                     size_t *out_len);
/* The header block of a delivery, written into *buf (grown with realloc as needed; the caller
 * owns it and reuses it across calls): "NATS/1.0", the stored block's lines (parsed as
 * dm_hdr_apply does) except those whose key is one of kv's keys, then kv's pairs, then the empty
 * line. The same headers as dm_hdr_apply + natsMsgHeader_Set + dm_hdr_from_msg, without a
 * natsMsg and without an allocation per message. Not NUL-terminated. */
fx_err dm_hdr_delivery(fx_slice block, const char *const *kv, size_t n_pairs, char **buf,
                       size_t *cap, size_t *out_len);
/* Add the lines of a stored block to a message (natsMsgHeader_Add). */
natsStatus dm_hdr_apply(natsMsg *m, fx_slice block);

/* The header lines of a block, as dm_hdr_delivery and dm_hdr_apply both read them (see the top
 * of this file). key and val point into the block (borrowed, not NUL-terminated). */
typedef struct hdr_iter {
    const char *p, *end; /* p: the "\r\n" ending the previous line; NULL when done */
} hdr_iter;
void dm_hdr_iter_init(hdr_iter *it, const char *b, size_t len);
bool dm_hdr_iter_next(hdr_iter *it, fx_slice *key, fx_slice *val); /* false: no more lines */

#endif
