/* etcd_pb.h -- etcd v3 KV messages in protobuf, for the gRPC transport of etcd.c.
 *
 * What it covers: the requests and responses of the KV service (Range, Put, DeleteRange, Txn)
 * in etcd 3.4's rpc.proto / kv.proto field numbers, encoded and decoded by hand (no generated
 * code, no dependency). Lease, auth, maintenance and watch calls stay on the JSON gateway
 * (etcd_json.h).
 *
 * Requests: fx_pb_*_req() write one gRPC message frame (1 byte "not compressed", 4 bytes
 * big-endian length, the message) into a malloc'd buffer (*out, *out_len; the caller frees).
 * Fields at their proto3 default are omitted, except a compare's target value, which is always
 * written (the oneof says which target is meant).
 *
 * Responses: fx_pb_parse_*() read one message (the frame's payload, without the 5-byte prefix)
 * into the same result structs the JSON parser fills (etcd.h), with the same ownership: on
 * FX_OK the caller frees them with the matching *_free(); on error they are left zeroed. Every
 * fx_bytes is NUL-terminated one past len, and a missing key or value is an empty, allocated
 * one, as from the JSON parser. Parsing is bounded: every length is checked against what is
 * left, varints are at most 10 bytes, unknown fields are skipped, a nested txn response is
 * FX_EPROTO (fx_op_resp cannot hold one), malformed input is FX_EPROTO with a detail.
 *
 * fx_pb_frame() finds the single message of a gRPC response body (FX_EPROTO for a compressed
 * or truncated frame, or more than one).
 *
 * Thread rules: pure functions, no shared state.
 */
#ifndef FX_LEASE_ETCD_PB_H
#define FX_LEASE_ETCD_PB_H

#include <stddef.h>
#include <stdint.h>

#include "etcd.h"

fx_err fx_pb_range_req(const fx_range_req *r, uint8_t **out, size_t *out_len);
fx_err fx_pb_put_req(const fx_put_req *r, uint8_t **out, size_t *out_len);
fx_err fx_pb_del_req(const fx_del_req *r, uint8_t **out, size_t *out_len);
fx_err fx_pb_txn_req(const fx_txn_req *r, uint8_t **out, size_t *out_len);

/* The message of a one-message gRPC body: *msg points into body. */
fx_err fx_pb_frame(const uint8_t *body, size_t len, const uint8_t **msg, size_t *msg_len);

fx_err fx_pb_parse_range(const uint8_t *b, size_t n, fx_range_resp *out);
fx_err fx_pb_parse_put(const uint8_t *b, size_t n, fx_put_resp *out);
fx_err fx_pb_parse_del(const uint8_t *b, size_t n, fx_del_resp *out);
fx_err fx_pb_parse_txn(const uint8_t *b, size_t n, fx_txn_resp *out);

#endif
