/* pwatch.h -- one produce-offset watch per MQ client, shared by all its MPSC consumers.
 *
 * A watch stream per consumer (every claim of the bridge, every drain consumer) would cost one
 * thread and one TCP connection each. The hub keeps ONE watch stream on R/channels/ (every
 * channel's control keys; payloads live elsewhere) and hands each produce-offset put to the
 * consumers registered for that channel. A consumer registers first and reads its channel's produce
 * offsets once afterwards (the merge is a monotonic max, so an event and the read may arrive in any
 * order). Idle cost: one stream per client, whatever the number of consumers; etcd sends nothing on
 * an idle stream.
 *
 * Bounds: at most FX_PWATCH_MAX registrations (FX_EFULL beyond). Dispatch is a hash of the
 * channel id to a short chain (no allocation per event).
 *
 * Ownership and threads: created by the MQ client root on first use (client.c) and freed before
 * the backends; the fx_etcd and fx_mq_keys are borrowed. fx_pwatch_add/remove are thread-safe.
 * Callbacks run on the watch thread with the hub's lock held: they must not call add/remove and
 * must only take locks that are never held around add/remove. After fx_pwatch_remove(arg)
 * returns, no callback for arg runs or will run.
 */
#ifndef FX_BRIDGE_PWATCH_H
#define FX_BRIDGE_PWATCH_H

#include <stdint.h>

#include "etcd.h"
#include "fx_err.h"
#include "keys.h"

#define FX_PWATCH_MAX 1000000

typedef struct fx_pwatch fx_pwatch;
/* A produce offset of producer pidx of the registered channel was written (or snapshotted). */
typedef void (*fx_pwatch_fn)(void *arg, int64_t pidx, int64_t off);

/* Start the shared watch (returns once its first snapshot is in, or an error by timeout_ms). */
fx_err fx_pwatch_new(fx_etcd *etcd, const fx_mq_keys *keys, int timeout_ms, fx_pwatch **out);
/* Deliver the produce offsets of channel chan to fn(arg, ...) from now on. */
fx_err fx_pwatch_add(fx_pwatch *w, int64_t chan, fx_pwatch_fn fn, void *arg);
/* Stop delivering to arg (every registration with that arg). */
void fx_pwatch_remove(fx_pwatch *w, void *arg);
/* Registrations now (tests, metrics). */
size_t fx_pwatch_count(fx_pwatch *w);
/* Stop the stream and free. NULL is a no-op. */
void fx_pwatch_free(fx_pwatch *w);

#endif
