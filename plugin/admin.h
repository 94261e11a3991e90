/* admin.h -- the admin view of channels, read from etcd (answers of $FLUXON.API.* and fluxonctl).
 *
 *   $FLUXON.API.CHANNEL.LIST          -> {"channels":[{"name":"orders","mpmc_id":3,"backlog":12},...]}
 *   $FLUXON.API.CHANNEL.INFO.<name>   -> {"name":"orders","mpmc_id":3,"backlog":12,"delayed":0,
 *        "capacity":100000,"ttl_seconds":90,
 *        "sub_mpscs":[{"chan_id":7,"ready":true,"owner_member":5,"backlog":4,
 *                      "producers":[{"pidx":2,"produce_offset":41,"consume_offset":38}]}],
 *        "members":{"producers":[2,9],"consumers":[5]},
 *        "deliver_prefix":"q.orders","dlq":false}   (these two when the channel is configured)
 *   errors                            -> {"error":{"code":404,"description":"channel not found"}}
 * "delayed": messages waiting in the channel's delay index (bridge/delay.h, a count_only range;
 * null when it could not be read).
 * Backlog of a producer = produce_offset - consume_offset + 1 (produce offset = last written id,
 * -1 when absent; consume offset = next id to consume, 0 when absent).
 * Every read uses the client's op deadline; the answer is built from one consistent set of range
 * reads per channel (bounded: at most 4096 sub-MPSCs).
 * Ownership: returned strings are malloc'd; the caller frees. Thread rules: any thread.
 */
#ifndef FX_PLUGIN_ADMIN_H
#define FX_PLUGIN_ADMIN_H

#include "config.h"
#include "fluxon_mq.h"

/* Both return a JSON document (success or the error shape), or NULL on OOM. */
char *fx_admin_channel_list_json(fx_mq_client *c, const fx_config *cfg);
char *fx_admin_channel_info_json(fx_mq_client *c, const fx_config *cfg, const char *name);
/* Backlog of one channel (sum over its sub-MPSCs); FX_ENOTFOUND if it has no MPMC yet. */
fx_err fx_admin_channel_backlog(fx_mq_client *c, const char *name, int64_t *out);

#endif
