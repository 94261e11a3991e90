/* capture.h -- a channel's capture side (capture.c): its producer thread and capture
 * subscriptions, and the error replies and size bound the other NATS front-ends share. Called by
 * daemon.c (start, reload, drain), jsapi.c and redrive.c; the daemon context is dmctx.h. */
#ifndef FX_PLUGIN_CAPTURE_H
#define FX_PLUGIN_CAPTURE_H

#include "dmctx.h"

fx_err dm_chan_start(dm_chan *ch);          /* producer thread + capture subscriptions */
/* Drain the capture subscriptions (unsubscribe when NATS is down), then wait until deadline. */
void dm_chan_drain_capture_begin(dm_chan *ch);
void dm_chan_drain_capture_wait(dm_chan *ch, int64_t deadline_ms);
void dm_chan_stop_producer_begin(dm_chan *ch);
void dm_chan_stop_producer_wait(dm_chan *ch);
/* The producer queue (dm_pq_*): pqueue.h. The header block codec (dm_hdr_*): hdr.h. */
size_t dm_max_msg_bytes(fx_daemon *d);
void dm_reply_error(fx_daemon *d, const char *reply, int code, const char *desc);

#endif
