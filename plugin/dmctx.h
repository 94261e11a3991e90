/* dmctx.h -- the daemon context: the state the plugin modules share (struct fx_daemon) and the
 * small accessors every module may call on it.
 *
 * The modules daemon.c wires (capture, claim, delayq, jsapi, pull, redrive) get the context as an
 * argument and read it through this header; none of them calls into daemon.c. What the daemon
 * must do for a module on request is a callback pointer in the context, set by fx_daemon_new
 * (e.g. nats_connect_aux). This file depends on no other plugin module but chan.h (the channel it
 * finds) and config.h (the config it hands out).
 */
#ifndef FX_PLUGIN_DMCTX_H
#define FX_PLUGIN_DMCTX_H

#include <stdbool.h>
#include <stdint.h>

#include "chan.h"
#include "config.h"

/* Active channel by name (caller holds d->reg). */
dm_chan *dm_find_chan_locked(fx_daemon *d, const char *name);
/* Interruptible wait on d->cv for ms (under d->mu); returns *flag (true: stop). */
bool dm_wait_flag(fx_daemon *d, const bool *flag, int64_t ms);
/* dm_wait_flag on d->stop_interest: true when the interest thread must stop. */
bool dm_bg_wait(fx_daemon *d, int64_t ms);
/* The daemon's NATS connection exists and is connected. Any thread. */
bool dm_nats_connected(fx_daemon *d);
/* The current config with a reference (release with fx_config_unref). Any thread. */
fx_config *dm_cfg_get(fx_daemon *d);
/* A fast non-cryptographic random number (xorshift, per thread, seeded by getrandom). */
uint64_t dm_rand64(void);

#endif
