/* fuzz_etcd_pb.c -- libFuzzer target: the protobuf parsers of etcd's gRPC KV answers
 * (lease/etcd_pb.h): range, put, delete, txn, and the gRPC frame. The first byte picks the
 * parser, the rest is the message (read only within [0, len)). Properties: on failure the result
 * is left zeroed (freeing it is safe, as the contract says); every key and value of a parsed kv
 * is allocated and NUL-terminated one past its length; a frame's message lies inside the body. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "etcd_pb.h"
#include "fx_log.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_kvs(const fx_kv *kvs, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!kvs[i].key.data || !kvs[i].value.data || kvs[i].key.data[kvs[i].key.len] ||
            kvs[i].value.data[kvs[i].value.len])
            abort();
}

static bool zeroed(const void *p, size_t n)
{
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++)
        if (b[i]) return false;
    return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int quiet;
    if (!quiet++) fx_log_set_level(FX_LOG_ERR);
    if (size < 1) return 0;
    unsigned sel = data[0];
    size_t len = size - 1;
    uint8_t *b = malloc(len ? len : 1); /* exact size: ASan sees a read past the end */
    if (!b) return 0;
    if (len) memcpy(b, data + 1, len);
    switch (sel % 5) {
    case 0: {
        fx_range_resp r;
        if (fx_pb_parse_range(b, len, &r) == FX_OK) check_kvs(r.kvs, r.n_kvs);
        else if (!zeroed(&r, sizeof r)) abort();
        fx_range_resp_free(&r);
        break;
    }
    case 1: {
        fx_put_resp r;
        if (fx_pb_parse_put(b, len, &r) == FX_OK) {
            if (r.has_prev) check_kvs(&r.prev_kv, 1);
        } else if (!zeroed(&r, sizeof r)) {
            abort();
        }
        fx_put_resp_free(&r);
        break;
    }
    case 2: {
        fx_del_resp r;
        if (fx_pb_parse_del(b, len, &r) == FX_OK) check_kvs(r.prev_kvs, r.n_prev_kvs);
        else if (!zeroed(&r, sizeof r)) abort();
        fx_del_resp_free(&r);
        break;
    }
    case 3: {
        fx_txn_resp r;
        if (fx_pb_parse_txn(b, len, &r) == FX_OK) {
            for (size_t i = 0; i < r.n_responses; i++)
                if (r.responses[i].type == FX_OP_RANGE)
                    check_kvs(r.responses[i].u.range.kvs, r.responses[i].u.range.n_kvs);
        } else if (!zeroed(&r, sizeof r)) {
            abort();
        }
        fx_txn_resp_free(&r);
        break;
    }
    default: {
        const uint8_t *m;
        size_t n;
        if (fx_pb_frame(b, len, &m, &n) == FX_OK && (m < b || m + n > b + len)) abort();
        break;
    }
    }
    free(b);
    return 0;
}
