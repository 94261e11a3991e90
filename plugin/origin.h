/* origin.h -- Fluxon-Origin: loop prevention by proof (dmctx.h FX_DM_HDR_ORIGIN). Every
 * delivery carries a keyed hash of its subject and reply subject under the daemon's 128-bit key
 * (fx_daemon.origin_key, from getrandom at start, never logged); capture skips a message only
 * when the tag verifies. Pure functions: any thread, no state. */
#ifndef FX_PLUGIN_ORIGIN_H
#define FX_PLUGIN_ORIGIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define FX_DM_ORIGIN_LEN 16 /* hex digits of the tag */

/* The tag of a delivery on subject with reply (NULL: none) under key: FX_DM_ORIGIN_LEN hex
 * digits and a NUL into out (cap > FX_DM_ORIGIN_LEN). */
void dm_origin_tag(const uint64_t key[2], const char *subject, const char *reply, char *out,
                   size_t cap);
/* true when value is the tag under key of a delivery on subject with reply (constant time). */
bool dm_origin_ours(const uint64_t key[2], const char *subject, const char *reply,
                    const char *value);

#endif
