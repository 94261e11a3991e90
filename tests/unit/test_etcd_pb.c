/* test_etcd_pb.c -- the protobuf codec of etcd's gRPC KV calls (lease/etcd_pb.h): request bytes
 * as etcd 3.4 decodes them (checked byte for byte against hand-encoded rpc.proto messages, which
 * etcd answered as expected when captured), answers captured from etcd 3.4, and malformed input:
 * bounded, FX_EPROTO, nothing leaked (the two leak inputs libFuzzer found are kept here). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "etcd_pb.h"

/* hex -> bytes (static buffer, one at a time) */
static const uint8_t *hex(const char *h, size_t *n)
{
    static uint8_t buf[512];
    *n = strlen(h) / 2;
    assert_true(*n <= sizeof buf);
    for (size_t i = 0; i < *n; i++) {
        unsigned v;
        assert_int_equal(sscanf(h + 2 * i, "%2x", &v), 1);
        buf[i] = (uint8_t)v;
    }
    return buf;
}

static void assert_bytes(const uint8_t *got, size_t n, const char *want_hex)
{
    size_t wn;
    const uint8_t *w = hex(want_hex, &wn);
    if (n != wn || memcmp(got, w, n) != 0) {
        char g[1025] = "";
        for (size_t i = 0; i < n && i < 512; i++) snprintf(g + 2 * i, 3, "%02x", got[i]);
        fail_msg("encoded %s, want %s", g, want_hex);
    }
}

#define HDR "0a1a08b298eaf1948386fccd0110cdd2918bd2b881cf8e01"

static void pb_requests(void **state)
{
    (void)state;
    uint8_t *b;
    size_t n;
    /* RangeRequest{key "a"} in a frame */
    fx_range_req r = {.key = FX_SLICE_STR("a")};
    assert_int_equal(fx_pb_range_req(&r, &b, &n), FX_OK);
    assert_bytes(b, n, "00000000030a0161");
    free(b);
    /* every range field, defaults omitted */
    uint8_t end[] = {'b'};
    fx_range_req r2 = {.key = FX_SLICE_STR("a"), .range_end = {end, 1}, .limit = 300, .revision = 7,
                       .sort_order = FX_SORT_DESCEND, .sort_target = FX_SORT_MOD,
                       .serializable = true, .keys_only = true, .count_only = true};
    assert_int_equal(fx_pb_range_req(&r2, &b, &n), FX_OK);
    assert_bytes(b, n, "00000000150a0161120162" "18ac02" "2007" "2802" "3003" "3801" "4001" "4801");
    free(b);
    /* ascending by key is etcd's natural order: sent as no sort (etcd would read every key of
     * the range for a sorted one, whatever the limit) */
    fx_range_req ka = {.key = FX_SLICE_STR("a"), .limit = 2, .sort_order = FX_SORT_ASCEND,
                       .sort_target = FX_SORT_KEY};
    assert_int_equal(fx_pb_range_req(&ka, &b, &n), FX_OK);
    assert_bytes(b, n, "00000000050a01611802");
    free(b);
    fx_range_req badsort = {.key = FX_SLICE_STR("a"), .sort_order = 7};
    assert_int_equal(fx_pb_range_req(&badsort, &b, &n), FX_EINVAL);
    /* PutRequest{/b, v, lease 0x1234, prev_kv} */
    fx_put_req p = {.key = FX_SLICE_STR("/b"), .value = FX_SLICE_STR("v"), .lease = 0x1234, .prev_kv = true};
    assert_int_equal(fx_pb_put_req(&p, &b, &n), FX_OK);
    assert_bytes(b, n, "000000000c0a022f62120176" "18b424" "2001");
    free(b);
    /* DeleteRangeRequest{/b, prev_kv} */
    fx_del_req d = {.key = FX_SLICE_STR("/b"), .prev_kv = true};
    assert_int_equal(fx_pb_del_req(&d, &b, &n), FX_OK);
    assert_bytes(b, n, "00000000060a022f621801");
    free(b);
    /* Txn: compare version(/a) > 0 (the 0 is written: the oneof names the target), success:
     * range /a, put /c x */
    fx_cmp c = {.target = FX_CMP_VERSION, .result = FX_CMP_GREATER, .key = FX_SLICE_STR("/a"), .num = 0};
    fx_op ops[2] = {{.type = FX_OP_RANGE, .u.range = {.key = FX_SLICE_STR("/a")}},
                    {.type = FX_OP_PUT, .u.put = {.key = FX_SLICE_STR("/c"), .value = FX_SLICE_STR("x")}}};
    fx_txn_req t = {.cmp = &c, .n_cmp = 1, .success = ops, .n_success = 2};
    assert_int_equal(fx_pb_txn_req(&t, &b, &n), FX_OK);
    assert_bytes(b, n, "000000001d" "0a080801" "1a022f61" "2000" "12060a040a022f61" "1209"
                       "12070a022f63120178");
    free(b);
    /* a value compare with an empty value and a range_end (field 64), failure branch delete */
    fx_cmp cv = {.target = FX_CMP_VALUE, .result = FX_CMP_EQUAL, .key = FX_SLICE_STR("k"),
                 .range_end = {end, 1}};
    fx_op del = {.type = FX_OP_DELETE, .u.del = {.key = FX_SLICE_STR("k")}};
    fx_txn_req t2 = {.cmp = &cv, .n_cmp = 1, .failure = &del, .n_failure = 1};
    assert_int_equal(fx_pb_txn_req(&t2, &b, &n), FX_OK);
    assert_bytes(b, n, "00000000140a0b" "1003" "1a016b" "3a00" "82040162" "1a051a030a016b");
    free(b);
    /* bad enums are refused before anything is sent */
    fx_cmp bad = {.target = 9};
    fx_txn_req t3 = {.cmp = &bad, .n_cmp = 1};
    b = (uint8_t *)"x";
    assert_int_equal(fx_pb_txn_req(&t3, &b, &n), FX_EINVAL);
    assert_null(b);
}

static void pb_answers(void **state)
{
    (void)state;
    size_t n;
    const uint8_t *m;
    /* range of one kv, as etcd answered */
    m = hex(HDR "1806200212110a022f611002180620052a0568656c6c6f2001", &n);
    fx_range_resp r;
    assert_int_equal(fx_pb_parse_range(m, n, &r), FX_OK);
    assert_int_equal(r.revision, 6);
    assert_int_equal(r.count, 1);
    assert_int_equal(r.n_kvs, 1);
    assert_string_equal((char *)r.kvs[0].key.data, "/a");
    assert_string_equal((char *)r.kvs[0].value.data, "hello");
    assert_int_equal(r.kvs[0].create_revision, 2);
    assert_int_equal(r.kvs[0].mod_revision, 6);
    assert_int_equal(r.kvs[0].version, 5);
    fx_range_resp_free(&r);
    /* put with prev_kv; delete with prev_kvs */
    m = hex(HDR "18072002" "120d0a022f621007180720012a0176", &n);
    fx_put_resp p;
    assert_int_equal(fx_pb_parse_put(m, n, &p), FX_OK);
    assert_true(p.has_prev);
    assert_string_equal((char *)p.prev_kv.value.data, "v");
    fx_put_resp_free(&p);
    m = hex(HDR "180820021001" "1a0d0a022f621007180720012a0176", &n);
    fx_del_resp d;
    assert_int_equal(fx_pb_parse_del(m, n, &d), FX_OK);
    assert_int_equal(d.deleted, 1);
    assert_int_equal(d.n_prev_kvs, 1);
    fx_del_resp_free(&d);
    /* txn: succeeded, a range response and a put response */
    m = hex(HDR "18092002" "1001" "1a1b0a190a02180812110a022f611002180620052a0568656c6c6f2001"
                "1a0612040a021809", &n);
    fx_txn_resp t;
    assert_int_equal(fx_pb_parse_txn(m, n, &t), FX_OK);
    assert_int_equal(t.revision, 9);
    assert_true(t.succeeded);
    assert_int_equal(t.n_responses, 2);
    assert_int_equal(t.responses[0].type, FX_OP_RANGE);
    assert_int_equal(t.responses[0].u.range.n_kvs, 1);
    assert_int_equal(t.responses[1].type, FX_OP_PUT);
    assert_int_equal(t.responses[1].u.put.revision, 9);
    fx_txn_resp_free(&t);
    /* a kv without key or value: both empty and allocated */
    m = hex(HDR "18062002" "12021002", &n);
    assert_int_equal(fx_pb_parse_range(m, n, &r), FX_OK);
    assert_non_null(r.kvs[0].key.data);
    assert_int_equal(r.kvs[0].value.len, 0);
    fx_range_resp_free(&r);
    /* the frame */
    const uint8_t *msg;
    size_t ml;
    m = hex("000000001c" HDR "18072002", &n);
    assert_int_equal(fx_pb_frame(m, n, &msg, &ml), FX_OK);
    assert_int_equal(ml, n - 5);
}

static void pb_malformed(void **state)
{
    (void)state;
    size_t n;
    const uint8_t *m;
    fx_txn_resp t;
    fx_range_resp r;
    const uint8_t *msg;
    size_t ml;
    /* libFuzzer: an op with two responses, the second a range (the first leaked) */
    m = hex("0a1a08b298eaf1948386fccd0110cdd2918bd2b881cf8e011809200210011a1b0a0612040a0218091a08"
            "b298eaf1948386fccd0110cdd2918bd2b881cf8e011809", &n);
    assert_int_equal(fx_pb_parse_txn(m, n, &t), FX_EPROTO);
    fx_txn_resp_free(&t);
    /* libFuzzer: a range response then a malformed field in the same op (the range leaked) */
    m = hex("0a1a08b298eaf1948386fccd0110cdd2918bd2b881cf8e011809200210011a210a190a02180812110a022f"
            "611002180620052a0568656c6c6f20011a061204cb021809", &n);
    assert_int_equal(fx_pb_parse_txn(m, n, &t), FX_EPROTO);
    /* truncated length, an 11-byte varint, a group wire type, a wrong wire type */
    const char *bad[] = {"0a05", "18ffffffffffffffffffff01", "0b", "1a01", "0a0118"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        m = hex(bad[i], &n);
        assert_int_equal(fx_pb_parse_range(m, n, &r), FX_EPROTO);
        assert_null(r.kvs);
    }
    /* nested txn response */
    m = hex("1a0222" "00", &n);
    assert_int_equal(fx_pb_parse_txn(m, n, &t), FX_EPROTO);
    /* frames: compressed, truncated, two messages, too short */
    const char *frames[] = {"0100000000", "0000000005aa", "000000000100aa", "0000"};
    for (size_t i = 0; i < sizeof frames / sizeof frames[0]; i++) {
        m = hex(frames[i], &n);
        assert_int_equal(fx_pb_frame(m, n, &msg, &ml), FX_EPROTO);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(pb_requests),
        cmocka_unit_test(pb_answers),
        cmocka_unit_test(pb_malformed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
