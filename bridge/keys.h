/* keys.h -- every etcd key and KV payload key of Fluxon MQ: builders, prefixes, parsers.
 *
 * Layout (the key layout of the Fluxon MQ reference implementation, kept compatible; see
 * docs/ARCHITECTURE.md "Keys and objects"). Every control-plane key lives under a configurable
 * root R (default "/fluxon"), including the keys that have no leading slash in the reference
 * implementation ("dist_id_allocator/...", "cluster_lease/..."):
 *
 *   MPSC (standalone or sub-MPSC of an MPMC)            value (meta.h)
 *     R/channels/meta/{chan}                              ChanGlobalMeta JSON
 *     R/channels/{chan}/producer/producer_{pidx}          ProducerMemberMeta JSON
 *     R/channels/{chan}/producer_weight/{pidx}            decimal, default "1"
 *     R/channels/{chan}/consumer/consumer_{cidx}          ChanMemberMeta JSON
 *     R/channels/{chan}/producer_offset_of_all_producer/{pidx}   last written msg id
 *     R/channels/{chan}/consumer_offset_of_all_producer/{pidx}   next msg id to consume
 *   MPMC
 *     R/mpmc_channels/{mpmc}/meta                         MPMC meta JSON
 *     R/mpmc_channels/{mpmc}/next_channel_id              "0" (dead state, kept for layout)
 *     R/mpmc_channels/{mpmc}/mpsc_channels                JSON list of decimal strings
 *     R/mpmc_channels/{mpmc}/create_lock                  etcd lock name
 *     R/mpmc_channels/producer/{mpmc}/{member}            "dummy_value" (role key)
 *     R/mpmc_channels/consumer/{mpmc}/{member}            "dummy_value" (role key)
 *     R/mpmc_channels/ready/{mpmc}/{mpsc}                 claiming consumer's member id
 *   Global / helper
 *     R/dist_id_allocator/channels                        chan id counter (unleased)
 *     R/dist_id_allocator/channels/{chan}                 producer idx counter
 *     R/dist_id_allocator/channels/{chan}/consumers       consumer idx counter
 *     R/dist_id_allocator/mpmc_channels                   mpmc id counter (unleased)
 *     R/dist_id_allocator/mpmc_channels/{mpmc}            mpmc member id counter
 *     R/cluster_lease/channels/{chan}                     lease id (under itself)
 *     R/cluster_lease/id_allocator/channels/{chan}        lease id (under itself)
 *     R/mq_unique_keys/{name}                             mpmc id of channel `name`
 *     R/mq_unique_locks/{name}                            lock token
 *
 * Payload keys live in the KV store, *relative to the store's own prefix* (kv.h), so they carry
 * no root and no leading slash. The message id is ZERO-PADDED to FX_MQ_MSGID_WIDTH (20) decimal
 * digits, so byte order equals numeric order and a run [from, to) of one producer is one range
 * read (fx_mq_payload_range):
 *     mpmc/{mpmc}/mpsc_{chan}/producer/{pidx}/msg_{msgid:020}     sub-MPSC of an MPMC
 *     mpscchan_{chan}_producer_{pidx}_msg_{msgid:020}             standalone MPSC
 *   count_prefix("mpmc/{mpmc}/mpsc_{chan}/") counts every stored message of one sub-MPSC.
 *
 * Ids in keys: canonical decimal (no sign, no leading zeros, "0" allowed), 0..INT64_MAX, except
 * the padded message id (exactly 20 digits, value 0..INT64_MAX). Builders reject negative ids
 * with FX_EINVAL. Parsers are strict: exact literal segments, canonical ids, nothing trailing,
 * keys at most FX_MQ_KEY_CAP-1 bytes; anything else is FX_EPROTO (keys come from the store).
 * Channel names (unique keys) are 1..FX_MQ_NAME_MAX bytes, no '/', no space, no ASCII control
 * character or DEL (bytes >= 0x80 are allowed, for UTF-8 subject tokens).
 *
 * Root prefix: starts with '/', does not end with '/', no empty segment ("//"), 2..FX_MQ_ROOT_MAX
 * bytes, printable ASCII without space.
 *
 * Ownership: no allocation anywhere. Results are written into a caller-owned fx_mq_key (a fixed
 * buffer that always fits: FX_MQ_KEY_CAP), NUL-terminated; fx_mq_key_slice() borrows it.
 * Inputs are borrowed for the call. On error the output key is set to the empty string.
 * Thread rules: all functions are pure and thread-safe. An fx_mq_keys is immutable after
 * fx_mq_keys_init() and may be shared by any number of threads.
 */
#ifndef FX_BRIDGE_KEYS_H
#define FX_BRIDGE_KEYS_H

#include <stddef.h>
#include <stdint.h>

#include "etcd.h"
#include "fx_err.h"

#define FX_MQ_DEFAULT_ROOT "/fluxon"
#define FX_MQ_ROOT_MAX 128   /* max root prefix length in bytes */
#define FX_MQ_NAME_MAX 200   /* max channel name (unique id) length in bytes */
#define FX_MQ_KEY_CAP 512    /* every key fits in this many bytes including the NUL */
#define FX_MQ_MSGID_WIDTH 20 /* zero-padded width of message ids in payload keys */

/* Member role (role keys, ChanMemberMeta.role). */
typedef enum fx_mq_role { FX_MQ_ROLE_PRODUCER = 0, FX_MQ_ROLE_CONSUMER = 1 } fx_mq_role;
/* "producer" / "consumer"; "?" for out-of-range values. Static string. */
const char *fx_mq_role_name(fx_mq_role r);

/* Key-builder context: the validated root prefix. Read-only after init. */
typedef struct fx_mq_keys {
    char root[FX_MQ_ROOT_MAX + 1];
    size_t root_len;
} fx_mq_keys;

/* A built key: s[0..len) plus a NUL at s[len]. */
typedef struct fx_mq_key {
    size_t len;
    char s[FX_MQ_KEY_CAP];
} fx_mq_key;

static inline fx_slice fx_mq_key_slice(const fx_mq_key *key) { return (fx_slice){key->s, key->len}; }

/* Validate root (NULL -> FX_MQ_DEFAULT_ROOT) and store it in *k. FX_EINVAL (detail says why)
 * for an invalid root; *k is then unusable (root_len 0). */
fx_err fx_mq_keys_init(fx_mq_keys *k, const char *root);
/* FX_OK if root is a valid root prefix (same rules as fx_mq_keys_init), else FX_EINVAL. */
fx_err fx_mq_root_validate(const char *root);
/* FX_OK if name is a valid channel name for unique keys, else FX_EINVAL. */
fx_err fx_mq_name_validate(const char *name);

/* ---- MPSC keys ------------------------------------------------------------------------------ */
fx_err fx_mq_key_chan_meta(const fx_mq_keys *k, int64_t chan, fx_mq_key *out);
fx_err fx_mq_key_producer_member(const fx_mq_keys *k, int64_t chan, int64_t pidx, fx_mq_key *out);
fx_err fx_mq_key_producer_weight(const fx_mq_keys *k, int64_t chan, int64_t pidx, fx_mq_key *out);
fx_err fx_mq_key_consumer_member(const fx_mq_keys *k, int64_t chan, int64_t cidx, fx_mq_key *out);
fx_err fx_mq_key_produce_offset(const fx_mq_keys *k, int64_t chan, int64_t pidx, fx_mq_key *out);
fx_err fx_mq_key_consume_offset(const fx_mq_keys *k, int64_t chan, int64_t pidx, fx_mq_key *out);

/* Prefixes (all end with '/'): use with fx_prefix_end() for a range. */
/* R/channels/{chan}/ : every per-channel key except the meta key (rollback delete). */
fx_err fx_mq_prefix_chan(const fx_mq_keys *k, int64_t chan, fx_mq_key *out);
/* R/channels/{chan}/producer/ : producer memberships. */
fx_err fx_mq_prefix_producer_members(const fx_mq_keys *k, int64_t chan, fx_mq_key *out);
/* R/channels/{chan}/consumer/ : consumer memberships. */
fx_err fx_mq_prefix_consumer_members(const fx_mq_keys *k, int64_t chan, fx_mq_key *out);
/* R/channels/{chan}/producer_weight/ */
fx_err fx_mq_prefix_producer_weights(const fx_mq_keys *k, int64_t chan, fx_mq_key *out);
/* R/channels/{chan}/producer_offset_of_all_producer/ */
fx_err fx_mq_prefix_produce_offsets(const fx_mq_keys *k, int64_t chan, fx_mq_key *out);
/* R/channels/{chan}/consumer_offset_of_all_producer/ */
fx_err fx_mq_prefix_consume_offsets(const fx_mq_keys *k, int64_t chan, fx_mq_key *out);

/* ---- MPMC keys ------------------------------------------------------------------------------ */
fx_err fx_mq_key_mpmc_meta(const fx_mq_keys *k, int64_t mpmc, fx_mq_key *out);
fx_err fx_mq_key_mpmc_next_channel_id(const fx_mq_keys *k, int64_t mpmc, fx_mq_key *out);
fx_err fx_mq_key_mpmc_mpsc_channels(const fx_mq_keys *k, int64_t mpmc, fx_mq_key *out);
fx_err fx_mq_key_mpmc_create_lock(const fx_mq_keys *k, int64_t mpmc, fx_mq_key *out);
fx_err fx_mq_key_mpmc_role(const fx_mq_keys *k, fx_mq_role role, int64_t mpmc, int64_t member,
                           fx_mq_key *out);
fx_err fx_mq_key_mpmc_ready(const fx_mq_keys *k, int64_t mpmc, int64_t mpsc, fx_mq_key *out);
/* R/mpmc_channels/{mpmc}/ : meta, next_channel_id, mpsc_channels, create_lock. */
fx_err fx_mq_prefix_mpmc(const fx_mq_keys *k, int64_t mpmc, fx_mq_key *out);
/* R/mpmc_channels/{producer|consumer}/{mpmc}/ : role keys (active members) of one role. */
fx_err fx_mq_prefix_mpmc_role(const fx_mq_keys *k, fx_mq_role role, int64_t mpmc, fx_mq_key *out);
/* R/mpmc_channels/ready/{mpmc}/ : ready keys. */
fx_err fx_mq_prefix_mpmc_ready(const fx_mq_keys *k, int64_t mpmc, fx_mq_key *out);

/* ---- global and helper keys ------------------------------------------------------------------ */
/* R/dist_id_allocator/channels : global chan id counter (never leased). */
fx_err fx_mq_key_alloc_chan_ids(const fx_mq_keys *k, fx_mq_key *out);
/* R/dist_id_allocator/channels/{chan} : producer idx counter (standalone MPSC). */
fx_err fx_mq_key_alloc_producer_idx(const fx_mq_keys *k, int64_t chan, fx_mq_key *out);
/* R/dist_id_allocator/channels/{chan}/consumers : consumer idx counter. */
fx_err fx_mq_key_alloc_consumer_idx(const fx_mq_keys *k, int64_t chan, fx_mq_key *out);
/* R/dist_id_allocator/channels/{chan}/ : rollback prefix (does not cover the producer counter). */
fx_err fx_mq_prefix_alloc_chan(const fx_mq_keys *k, int64_t chan, fx_mq_key *out);
/* R/dist_id_allocator/mpmc_channels : mpmc id counter (never leased). */
fx_err fx_mq_key_alloc_mpmc_ids(const fx_mq_keys *k, fx_mq_key *out);
/* R/dist_id_allocator/mpmc_channels/{mpmc} : MPMC member id counter. */
fx_err fx_mq_key_alloc_mpmc_member_ids(const fx_mq_keys *k, int64_t mpmc, fx_mq_key *out);
/* R/cluster_lease/channels/{chan} : the channel global lease id. */
fx_err fx_mq_key_cluster_lease_chan(const fx_mq_keys *k, int64_t chan, fx_mq_key *out);
/* R/cluster_lease/id_allocator/channels/{chan} : the channel global-long lease id. */
fx_err fx_mq_key_cluster_lease_id_alloc(const fx_mq_keys *k, int64_t chan, fx_mq_key *out);
/* R/mq_unique_keys/{name} and R/mq_unique_locks/{name}; name checked by fx_mq_name_validate. */
fx_err fx_mq_key_unique(const fx_mq_keys *k, const char *name, fx_mq_key *out);
fx_err fx_mq_key_unique_lock(const fx_mq_keys *k, const char *name, fx_mq_key *out);
/* R/mq_unique_keys/ : every channel-name mapping (admin listing). */
fx_err fx_mq_prefix_unique(const fx_mq_keys *k, fx_mq_key *out);

/* ---- payload keys (relative to the KV store prefix, no root) -------------------------------- */
/* mpmc/{mpmc}/mpsc_{chan}/producer/{pidx}/msg_{msgid:020}; msgid 0..INT64_MAX. */
fx_err fx_mq_payload_key(int64_t mpmc, int64_t chan, int64_t pidx, int64_t msgid, fx_mq_key *out);
/* mpmc/{mpmc}/ : every payload of one MPMC. */
fx_err fx_mq_payload_prefix_mpmc(int64_t mpmc, fx_mq_key *out);
/* mpmc/{mpmc}/mpsc_{chan}/ : every payload of one sub-MPSC (capacity count_prefix). */
fx_err fx_mq_payload_prefix_mpsc(int64_t mpmc, int64_t chan, fx_mq_key *out);
/* mpmc/{mpmc}/mpsc_{chan}/producer/{pidx}/msg_ : every payload of one producer. */
fx_err fx_mq_payload_prefix_producer(int64_t mpmc, int64_t chan, int64_t pidx, fx_mq_key *out);
/* The half-open key range [start, end) holding exactly the message ids from..to_excl-1 of one
 * producer (0 <= from <= to_excl <= INT64_MAX); both keys are full payload keys. */
fx_err fx_mq_payload_range(int64_t mpmc, int64_t chan, int64_t pidx, int64_t from,
                           int64_t to_excl, fx_mq_key *start, fx_mq_key *end);

/* Standalone MPSC payloads: mpscchan_{chan}_producer_{pidx}_msg_{msgid:020}. */
fx_err fx_mq_mpsc_payload_key(int64_t chan, int64_t pidx, int64_t msgid, fx_mq_key *out);
/* mpscchan_{chan}_ : every payload of one standalone MPSC. */
fx_err fx_mq_mpsc_payload_prefix_chan(int64_t chan, fx_mq_key *out);
/* mpscchan_{chan}_producer_{pidx}_msg_ : every payload of one producer. */
fx_err fx_mq_mpsc_payload_prefix_producer(int64_t chan, int64_t pidx, fx_mq_key *out);

/* ---- parsers (FX_EPROTO on any mismatch; outputs untouched on error; out pointers may be
 *      NULL when the caller does not need that id) ------------------------------------------- */
fx_err fx_mq_parse_chan_meta_key(const fx_mq_keys *k, fx_slice key, int64_t *chan);
fx_err fx_mq_parse_producer_member_key(const fx_mq_keys *k, fx_slice key, int64_t *chan,
                                       int64_t *pidx);
fx_err fx_mq_parse_consumer_member_key(const fx_mq_keys *k, fx_slice key, int64_t *chan,
                                       int64_t *cidx);
fx_err fx_mq_parse_producer_weight_key(const fx_mq_keys *k, fx_slice key, int64_t *chan,
                                       int64_t *pidx);
fx_err fx_mq_parse_produce_offset_key(const fx_mq_keys *k, fx_slice key, int64_t *chan,
                                      int64_t *pidx);
fx_err fx_mq_parse_consume_offset_key(const fx_mq_keys *k, fx_slice key, int64_t *chan,
                                      int64_t *pidx);
fx_err fx_mq_parse_mpmc_meta_key(const fx_mq_keys *k, fx_slice key, int64_t *mpmc);
fx_err fx_mq_parse_ready_key(const fx_mq_keys *k, fx_slice key, int64_t *mpmc, int64_t *mpsc);
fx_err fx_mq_parse_role_key(const fx_mq_keys *k, fx_slice key, fx_mq_role *role, int64_t *mpmc,
                            int64_t *member);
/* R/mq_unique_keys/{name}: copies the name (NUL-terminated) into name_out[name_cap];
 * name_cap must be > FX_MQ_NAME_MAX. The name must pass fx_mq_name_validate. */
fx_err fx_mq_parse_unique_key(const fx_mq_keys *k, fx_slice key, char *name_out, size_t name_cap);
/* Payload keys, as returned by the KV store (relative). */
fx_err fx_mq_parse_payload_key(fx_slice key, int64_t *mpmc, int64_t *chan, int64_t *pidx,
                               int64_t *msgid);
fx_err fx_mq_parse_mpsc_payload_key(fx_slice key, int64_t *chan, int64_t *pidx, int64_t *msgid);
/* Generic: key must be prefix followed by one canonical decimal id (0..INT64_MAX) and nothing
 * else (e.g. a watch on a prefix built above). */
fx_err fx_mq_parse_id_after(fx_slice key, fx_slice prefix, int64_t *id);

#endif
