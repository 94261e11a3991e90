/* Unit tests: etcd JSON gateway codecs (etcd_json.h), fed with the real captures of
 * etcd 3.4.23's JSON gateway (requests and responses recorded from a real server). No network. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "etcd_json.h"

#define P(s) (s), strlen(s)
#define HDR(rev) "\"header\":{\"cluster_id\":\"10019786756681134148\",\"member_id\":" \
                 "\"10564442889135048893\",\"revision\":\"" rev "\",\"raft_term\":\"2\"}"

static void assert_bytes(const fx_bytes *b, const char *want)
{
    assert_non_null(b->data);
    assert_int_equal(b->len, strlen(want));
    if (b->len) assert_memory_equal(b->data, want, b->len);
    assert_int_equal(b->data[b->len], '\0');
}

/* Walk "a.b.0.c" through objects and arrays of a parsed request. */
static const cJSON *jget(const cJSON *o, const char *path)
{
    char buf[256];
    snprintf(buf, sizeof buf, "%s", path);
    char *save = NULL;
    for (char *t = strtok_r(buf, ".", &save); t && o; t = strtok_r(NULL, ".", &save)) {
        if (cJSON_IsArray(o))
            o = cJSON_GetArrayItem(o, atoi(t));
        else
            o = cJSON_GetObjectItemCaseSensitive(o, t);
    }
    return o;
}

static const char *jstr(const cJSON *root, const char *path)
{
    const cJSON *it = jget(root, path);
    if (!cJSON_IsString(it)) fail_msg("%s: not a string", path);
    return it->valuestring;
}

static cJSON *parse_req(char *txt)
{
    assert_non_null(txt);
    cJSON *j = cJSON_Parse(txt);
    assert_non_null(j);
    free(txt);
    return j;
}

/* ---- range -------------------------------------------------------------------------------- */

static const char range_prefix_body[] =
    "{" HDR("10") ",\"kvs\":[{\"key\":\"YXBwL2E=\",\"create_revision\":\"5\",\"mod_revision\":\"6\","
    "\"version\":\"2\",\"value\":\"djI=\"},{\"key\":\"YXBwL2I=\",\"create_revision\":\"7\","
    "\"mod_revision\":\"7\",\"version\":\"1\",\"value\":\"dmI=\"},{\"key\":\"YXBwL2M=\","
    "\"create_revision\":\"8\",\"mod_revision\":\"10\",\"version\":\"2\",\"value\":\"dmM=\"}],"
    "\"count\":\"3\"}";

static void range_prefix_with_kvs_and_count(void **state)
{
    (void)state;
    fx_range_resp r;
    assert_int_equal(fx_ej_parse_range(P(range_prefix_body), &r), FX_OK);
    assert_int_equal(r.revision, 10);
    assert_int_equal(r.count, 3);
    assert_false(r.more);
    assert_int_equal(r.n_kvs, 3);
    assert_bytes(&r.kvs[0].key, "app/a");
    assert_bytes(&r.kvs[0].value, "v2");
    assert_int_equal(r.kvs[0].create_revision, 5);
    assert_int_equal(r.kvs[0].mod_revision, 6);
    assert_int_equal(r.kvs[0].version, 2);
    assert_int_equal(r.kvs[0].lease, 0);
    assert_bytes(&r.kvs[1].key, "app/b");
    assert_bytes(&r.kvs[1].value, "vb");
    assert_bytes(&r.kvs[2].key, "app/c");
    assert_int_equal(r.kvs[2].mod_revision, 10);
    fx_range_resp_free(&r);
    assert_null(r.kvs);
    assert_int_equal(r.n_kvs, 0);
    fx_range_resp_free(&r); /* twice is safe */
}

static void range_limit_more_and_keys_only(void **state)
{
    (void)state;
    const char *body =
        "{" HDR("10") ",\"kvs\":[{\"key\":\"YXBwL2E=\",\"create_revision\":\"5\",\"mod_revision\":"
        "\"6\",\"version\":\"2\"},{\"key\":\"YXBwL2I=\",\"create_revision\":\"7\",\"mod_revision\":"
        "\"7\",\"version\":\"1\"}],\"more\":true,\"count\":\"3\"}";
    fx_range_resp r;
    assert_int_equal(fx_ej_parse_range(P(body), &r), FX_OK);
    assert_true(r.more);
    assert_int_equal(r.count, 3);
    assert_int_equal(r.n_kvs, 2);
    assert_bytes(&r.kvs[1].key, "app/b");
    assert_bytes(&r.kvs[1].value, ""); /* keys_only: value omitted -> empty, still non-NULL */
    fx_range_resp_free(&r);
}

static void range_missing_key_and_count_only(void **state)
{
    (void)state;
    fx_range_resp r;
    assert_int_equal(fx_ej_parse_range(P("{" HDR("10") "}"), &r), FX_OK);
    assert_int_equal(r.revision, 10);
    assert_int_equal(r.n_kvs, 0);
    assert_null(r.kvs);
    assert_int_equal(r.count, 0);
    assert_false(r.more);
    fx_range_resp_free(&r);

    assert_int_equal(fx_ej_parse_range(P("{" HDR("10") ",\"count\":\"3\"}"), &r), FX_OK);
    assert_int_equal(r.count, 3);
    assert_int_equal(r.n_kvs, 0);
    fx_range_resp_free(&r);
}

static void range_historical_with_lease(void **state)
{
    (void)state;
    const char *body = "{" HDR("10") ",\"kvs\":[{\"key\":\"YXBwL2E=\",\"create_revision\":\"5\","
                       "\"mod_revision\":\"5\",\"version\":\"1\",\"value\":\"djE=\","
                       "\"lease\":\"5241523851781477651\"}],\"count\":\"1\"}";
    fx_range_resp r;
    assert_int_equal(fx_ej_parse_range(P(body), &r), FX_OK);
    assert_int_equal(r.n_kvs, 1);
    assert_true(r.kvs[0].lease == INT64_C(5241523851781477651));
    assert_bytes(&r.kvs[0].value, "v1");
    fx_range_resp_free(&r);
}

static void range_binary_key_and_value(void **state)
{
    (void)state;
    /* key 00 ff 61 ("AP9h"), value ff 00 ("/wA=") */
    const char *body = "{" HDR("3") ",\"kvs\":[{\"key\":\"AP9h\",\"value\":\"/wA=\"}]}";
    fx_range_resp r;
    assert_int_equal(fx_ej_parse_range(P(body), &r), FX_OK);
    assert_int_equal(r.kvs[0].key.len, 3);
    assert_memory_equal(r.kvs[0].key.data, "\x00\xff" "a", 3);
    assert_int_equal(r.kvs[0].value.len, 2);
    assert_memory_equal(r.kvs[0].value.data, "\xff\x00", 2);
    fx_range_resp_free(&r);
}

/* ---- put / delete ----------------------------------------------------------------------------- */

static void put_first_write_and_prev_kv(void **state)
{
    (void)state;
    fx_put_resp r;
    assert_int_equal(fx_ej_parse_put(P("{" HDR("5") "}"), &r), FX_OK);
    assert_int_equal(r.revision, 5);
    assert_false(r.has_prev);
    fx_put_resp_free(&r);

    const char *body = "{" HDR("6") ",\"prev_kv\":{\"key\":\"YXBwL2E=\",\"create_revision\":\"5\","
                       "\"mod_revision\":\"5\",\"version\":\"1\",\"value\":\"djE=\","
                       "\"lease\":\"5241523851781477651\"}}";
    assert_int_equal(fx_ej_parse_put(P(body), &r), FX_OK);
    assert_int_equal(r.revision, 6);
    assert_true(r.has_prev);
    assert_bytes(&r.prev_kv.key, "app/a");
    assert_bytes(&r.prev_kv.value, "v1");
    assert_true(r.prev_kv.lease == INT64_C(5241523851781477651));
    fx_put_resp_free(&r);
    assert_false(r.has_prev);
    assert_null(r.prev_kv.key.data);
}

static void deleterange_with_and_without_deleted(void **state)
{
    (void)state;
    fx_del_resp r;
    const char *body = "{" HDR("11") ",\"deleted\":\"1\",\"prev_kvs\":[{\"key\":\"YXBwL2I=\","
                       "\"create_revision\":\"7\",\"mod_revision\":\"7\",\"version\":\"1\","
                       "\"value\":\"dmI=\"}]}";
    assert_int_equal(fx_ej_parse_del(P(body), &r), FX_OK);
    assert_int_equal(r.revision, 11);
    assert_int_equal(r.deleted, 1);
    assert_int_equal(r.n_prev_kvs, 1);
    assert_bytes(&r.prev_kvs[0].value, "vb");
    fx_del_resp_free(&r);

    assert_int_equal(fx_ej_parse_del(P("{" HDR("11") "}"), &r), FX_OK);
    assert_int_equal(r.deleted, 0); /* omitted when nothing was deleted */
    assert_int_equal(r.n_prev_kvs, 0);
    fx_del_resp_free(&r);

    assert_int_equal(fx_ej_parse_del(P("{" HDR("12") ",\"deleted\":\"2\"}"), &r), FX_OK);
    assert_int_equal(r.deleted, 2);
    fx_del_resp_free(&r);
}

/* ---- txn ---------------------------------------------------------------------------------------- */

static void txn_succeeded_with_put(void **state)
{
    (void)state;
    const char *body = "{" HDR("13") ",\"succeeded\":true,\"responses\":[{\"response_put\":"
                       "{\"header\":{\"revision\":\"13\"}}}]}";
    fx_txn_resp r;
    assert_int_equal(fx_ej_parse_txn(P(body), &r), FX_OK);
    assert_true(r.succeeded);
    assert_int_equal(r.revision, 13);
    assert_int_equal(r.n_responses, 1);
    assert_int_equal(r.responses[0].type, FX_OP_PUT);
    assert_int_equal(r.responses[0].u.put.revision, 13);
    assert_false(r.responses[0].u.put.has_prev);
    fx_txn_resp_free(&r);
}

static void txn_failed_has_no_succeeded(void **state)
{
    (void)state;
    const char *body = "{" HDR("13") ",\"responses\":[{\"response_range\":{\"header\":"
                       "{\"revision\":\"13\"},\"kvs\":[{\"key\":\"dHhuL2s=\",\"create_revision\":"
                       "\"13\",\"mod_revision\":\"13\",\"version\":\"1\",\"value\":\"b25l\"}],"
                       "\"count\":\"1\"}}]}";
    fx_txn_resp r;
    assert_int_equal(fx_ej_parse_txn(P(body), &r), FX_OK);
    assert_false(r.succeeded);
    assert_int_equal(r.n_responses, 1);
    assert_int_equal(r.responses[0].type, FX_OP_RANGE);
    assert_int_equal(r.responses[0].u.range.n_kvs, 1);
    assert_bytes(&r.responses[0].u.range.kvs[0].key, "txn/k");
    assert_bytes(&r.responses[0].u.range.kvs[0].value, "one");
    assert_int_equal(r.responses[0].u.range.count, 1);
    fx_txn_resp_free(&r);
}

static void txn_multi_op_responses(void **state)
{
    (void)state;
    const char *body =
        "{" HDR("14") ",\"succeeded\":true,\"responses\":[{\"response_put\":{\"header\":{"
        "\"revision\":\"14\"},\"prev_kv\":{\"key\":\"dHhuL2s=\",\"create_revision\":\"13\","
        "\"mod_revision\":\"13\",\"version\":\"1\",\"value\":\"b25l\"}}},{\"response_delete_range\":"
        "{\"header\":{\"revision\":\"14\"}}},{\"response_range\":{\"header\":{\"revision\":\"14\"},"
        "\"kvs\":[{\"key\":\"dHhuL2s=\",\"create_revision\":\"13\",\"mod_revision\":\"14\","
        "\"version\":\"2\",\"value\":\"dHdv\"}],\"count\":\"1\"}}]}";
    fx_txn_resp r;
    assert_int_equal(fx_ej_parse_txn(P(body), &r), FX_OK);
    assert_true(r.succeeded);
    assert_int_equal(r.n_responses, 3);
    assert_int_equal(r.responses[0].type, FX_OP_PUT);
    assert_true(r.responses[0].u.put.has_prev);
    assert_bytes(&r.responses[0].u.put.prev_kv.value, "one");
    assert_int_equal(r.responses[1].type, FX_OP_DELETE);
    assert_int_equal(r.responses[1].u.del.deleted, 0);
    assert_int_equal(r.responses[1].u.del.revision, 14);
    assert_int_equal(r.responses[2].type, FX_OP_RANGE);
    assert_bytes(&r.responses[2].u.range.kvs[0].value, "two");
    assert_int_equal(r.responses[2].u.range.kvs[0].version, 2);
    fx_txn_resp_free(&r);
    assert_null(r.responses);
}

static void txn_nested_and_empty(void **state)
{
    (void)state;
    fx_txn_resp r;
    /* nested txn response (inner header {}): not representable -> FX_EPROTO, result zeroed */
    const char *nested = "{" HDR("15") ",\"succeeded\":true,\"responses\":[{\"response_txn\":{"
                         "\"header\":{},\"responses\":[{\"response_range\":{\"header\":"
                         "{\"revision\":\"15\"},\"count\":\"1\"}}]}}]}";
    assert_int_equal(fx_ej_parse_txn(P(nested), &r), FX_EPROTO);
    assert_null(r.responses);
    assert_int_equal(r.n_responses, 0);
    assert_non_null(strstr(fx_err_detail(), "nested"));
    /* a failed op in the middle frees the earlier ones (checked by ASan/valgrind) */
    const char *bad_second = "{\"responses\":[{\"response_put\":{}},{\"response_range\":"
                             "{\"kvs\":[{\"key\":\"!!\"}]}}]}";
    assert_int_equal(fx_ej_parse_txn(P(bad_second), &r), FX_EPROTO);
    assert_null(r.responses);
    /* {} -> {"header":..,"succeeded":true} */
    assert_int_equal(fx_ej_parse_txn(P("{" HDR("15") ",\"succeeded\":true}"), &r), FX_OK);
    assert_true(r.succeeded);
    assert_int_equal(r.n_responses, 0);
    fx_txn_resp_free(&r);
}

/* ---- leases, status, auth ------------------------------------------------------------------------ */

static void lease_grant_keepalive_timetolive(void **state)
{
    (void)state;
    int64_t id = 0, ttl = 0, granted = 0;
    assert_int_equal(fx_ej_parse_lease_grant(P("{" HDR("4") ",\"ID\":\"5241523851781477651\","
                                               "\"TTL\":\"60\"}"), &id, &ttl), FX_OK);
    assert_true(id == INT64_C(5241523851781477651));
    assert_int_equal(ttl, 60);
    assert_int_equal(fx_ej_parse_lease_grant(P("{" HDR("4") ",\"TTL\":\"60\"}"), &id, &ttl),
                     FX_EPROTO);
    assert_int_equal(id, 0);

    /* keepalive: stream endpoint, wrapped in "result" */
    assert_int_equal(fx_ej_parse_keepalive(P("{\"result\":{" HDR("27") ",\"ID\":"
                                             "\"5241523851781477701\",\"TTL\":\"30\"}}"), &ttl),
                     FX_OK);
    assert_int_equal(ttl, 30);
    /* unknown or expired lease: HTTP 200 and no TTL */
    ttl = 99;
    assert_int_equal(fx_ej_parse_keepalive(P("{\"result\":{" HDR("27") ",\"ID\":\"42\"}}"), &ttl),
                     FX_ELEASE_EXPIRED);
    assert_int_equal(ttl, 0);
    assert_non_null(strstr(fx_err_detail(), "42"));
    /* stream error object instead of a result */
    assert_int_equal(fx_ej_parse_keepalive(P("{\"error\":{\"grpc_code\":14,\"http_code\":503,"
                                             "\"message\":\"transport is closing\"}}"), &ttl),
                     FX_EUNAVAIL);
    /* empty reply */
    assert_int_equal(fx_ej_parse_keepalive("", 0, &ttl), FX_EPROTO);

    assert_int_equal(fx_ej_parse_timetolive(P("{" HDR("28") ",\"ID\":\"5241523851781477701\","
                                              "\"TTL\":\"28\",\"grantedTTL\":\"30\",\"keys\":"
                                              "[\"bGsvMQ==\",\"bGsvMg==\"]}"), &ttl, &granted),
                     FX_OK);
    assert_int_equal(ttl, 28);
    assert_int_equal(granted, 30);
    assert_int_equal(fx_ej_parse_timetolive(P("{" HDR("28") ",\"ID\":\"42\",\"TTL\":\"-1\"}"),
                                            &ttl, &granted), FX_OK);
    assert_int_equal(ttl, -1);
    assert_int_equal(granted, 0);

    int64_t rev = 0;
    assert_int_equal(fx_ej_parse_header(P("{" HDR("28") "}"), &rev), FX_OK);
    assert_int_equal(rev, 28);
}

static void status_and_auth(void **state)
{
    (void)state;
    fx_etcd_status s;
    const char *body = "{" HDR("59") ",\"version\":\"3.4.23\",\"dbSize\":\"15761408\",\"leader\":"
                       "\"10564442889135048893\",\"raftIndex\":\"59\",\"raftTerm\":\"2\","
                       "\"raftAppliedIndex\":\"59\",\"dbSizeInUse\":\"8216576\"}";
    assert_int_equal(fx_ej_parse_status(P(body), &s), FX_OK);
    assert_string_equal(s.version, "3.4.23");
    assert_int_equal(s.db_size, 15761408);
    /* uint64 member id above INT64_MAX: kept as its bit pattern */
    assert_true((uint64_t)s.leader == UINT64_C(10564442889135048893));
    assert_int_equal(s.raft_index, 59);
    assert_int_equal(s.revision, 59);

    char *tok = NULL;
    assert_int_equal(fx_ej_parse_auth(P("{" HDR("3") ",\"token\":\"fdUeTBOuCbhYmOTv.28\"}"), &tok),
                     FX_OK);
    assert_string_equal(tok, "fdUeTBOuCbhYmOTv.28");
    free(tok);
    assert_int_equal(fx_ej_parse_auth(P("{" HDR("3") "}"), &tok), FX_EPROTO);
    assert_null(tok);
    /* header injection attempt */
    assert_int_equal(fx_ej_parse_auth(P("{\"token\":\"a\\r\\nX-Evil: 1\"}"), &tok), FX_EPROTO);
    assert_null(tok);
}

/* ---- defensive parsing ------------------------------------------------------------------------------ */

static void wrong_types_and_garbage_are_eproto(void **state)
{
    (void)state;
    static const char *const bad[] = {
        "",                                           /* empty */
        "not json",                                   /* not JSON */
        "[1,2]",                                      /* not an object */
        "\"x\"",                                      /* not an object */
        "{\"header\":[]}",                            /* header not an object */
        "{\"header\":{\"revision\":{}}}",             /* int64 of the wrong type */
        "{\"header\":{\"revision\":\"12x\"}}",        /* trailing garbage */
        "{\"header\":{\"revision\":\" 12\"}}",        /* leading space */
        "{\"header\":{\"revision\":\"\"}}",           /* empty */
        "{\"header\":{\"revision\":\"99999999999999999999\"}}", /* overflow */
        "{\"header\":{\"revision\":7.5}}",            /* not integral */
        "{\"header\":{\"revision\":1e300}}",          /* out of range */
        "{\"header\":{\"revision\":true}}",           /* bool */
        "{\"kvs\":{}}",                               /* kvs not an array */
        "{\"kvs\":[1]}",                              /* kv not an object */
        "{\"kvs\":[{\"key\":5}]}",                    /* key not a string */
        "{\"kvs\":[{\"key\":\"Zm9v\"},{\"key\":\"Zm9\"}]}", /* bad base64 in the 2nd kv */
        "{\"kvs\":[{\"key\":\"-_8=\"}]}",             /* URL-safe base64 */
        "{\"more\":\"true\"}",                        /* bool as a string */
        "{\"count\":[]}",                             /* count not a number */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        fx_range_resp r;
        fx_err e = fx_ej_parse_range(P(bad[i]), &r);
        if (e != FX_EPROTO) fail_msg("body #%zu (%s): got %s", i, bad[i], fx_errname(e));
        assert_null(r.kvs);
        assert_int_equal(r.n_kvs, 0);
        assert_int_equal(r.revision, 0);
        assert_true(strlen(fx_err_detail()) > 0);
    }
}

static void lenient_where_the_wire_allows(void **state)
{
    (void)state;
    fx_range_resp r;
    /* numbers accepted when exact; null counts as absent; unknown fields ignored */
    assert_int_equal(fx_ej_parse_range(P("{\"header\":{\"revision\":12},\"count\":null,"
                                         "\"kvs\":null,\"new_field\":{\"x\":[1]}}"), &r), FX_OK);
    assert_int_equal(r.revision, 12);
    assert_int_equal(r.count, 0);
    fx_range_resp_free(&r);
    /* negative int64 and INT64 bounds */
    assert_int_equal(fx_ej_parse_range(P("{\"header\":{\"revision\":\"-9223372036854775808\"},"
                                         "\"count\":\"9223372036854775807\"}"), &r), FX_OK);
    assert_true(r.revision == INT64_MIN);
    assert_true(r.count == INT64_MAX);
    fx_range_resp_free(&r);
    /* trailing newline after the object (stream framing) */
    assert_int_equal(fx_ej_parse_range(P("{\"header\":{\"revision\":\"3\"}}\n"), &r), FX_OK);
    assert_int_equal(r.revision, 3);
    fx_range_resp_free(&r);
}

static void body_over_the_cap_is_refused(void **state)
{
    (void)state;
    /* The size check happens before anything is read. */
    size_t n = FX_EJ_MAX_BODY + 1;
    char *big = malloc(n);
    assert_non_null(big);
    memset(big, ' ', n);
    big[0] = '{';
    big[n - 1] = '}';
    fx_range_resp r;
    assert_int_equal(fx_ej_parse_range(big, n, &r), FX_EPROTO);
    assert_non_null(strstr(fx_err_detail(), "too large"));
    fx_ej_watch_line l;
    assert_int_equal(fx_ej_parse_watch_line(big, n, &l), FX_EPROTO);
    free(big);
}

/* ---- errors: every error shape the gateway was seen to return ----------------------------------------------------------- */

#define EBODY(msg, code) "{\"error\":\"" msg "\",\"message\":\"" msg "\",\"code\":" #code "}"

static void error_table_maps_every_row(void **state)
{
    (void)state;
    static const struct {
        int status;
        const char *body;
        fx_err want;
        int code;
    } rows[] = {
        {400, EBODY("illegal base64 data at input byte 0", 3), FX_EINVAL, 3},
        {400, EBODY("etcdserver: key is not provided", 3), FX_EINVAL, 3},
        {400, EBODY("etcdserver: too many operations in txn request", 3), FX_ETXN_TOO_MANY_OPS, 3},
        {400, EBODY("etcdserver: request is too large", 3), FX_ETOO_LARGE, 3},
        {400, EBODY("etcdserver: duplicate key given in txn request", 3), FX_EDUPLICATE_KEY, 3},
        {400, EBODY("etcdserver: lease is provided", 3), FX_EINVAL, 3},
        {400, EBODY("etcdserver: user name is empty", 3), FX_EAUTH, 3},
        {400, EBODY("etcdserver: authentication failed, invalid user ID or password", 3), FX_EAUTH, 3},
        {400, EBODY("unknown value \\\"MOD_REVISION\\\" for enum etcdserverpb.Compare_CompareTarget", 3),
         FX_EINVAL, 3},
        {400, EBODY("etcdserver: mvcc: required revision has been compacted", 11), FX_ECOMPACTED, 11},
        {400, EBODY("etcdserver: mvcc: required revision is a future revision", 11), FX_EFUTURE_REV, 11},
        {400, EBODY("etcdserver: too large lease TTL", 11), FX_EINVAL, 11},
        {401, EBODY("etcdserver: invalid auth token", 16), FX_EAUTH, 16},
        {403, EBODY("etcdserver: permission denied", 7), FX_EPERM, 7},
        {404, EBODY("etcdserver: requested lease not found", 5), FX_ENOTFOUND, 5},
        {412, EBODY("etcdserver: lease already exists", 9), FX_EEXISTS, 9},
        {412, EBODY("etcdserver: authentication is not enabled", 9), FX_EEXISTS, 9},
        {429, EBODY("etcdserver: mvcc: database space exceeded", 8), FX_ENOSPACE, 8},
        {429, EBODY("grpc: received message larger than max (2200010 vs. 2097152)", 8), FX_ENOSPACE, 8},
        {500, EBODY("unexpected EOF", 2), FX_ESERVER, 2},
        {504, EBODY("context deadline exceeded", 4), FX_ETIMEDOUT, 4},
        /* stream error object (HTTP 200 already sent), with and without http_code */
        {200, "{\"error\":{\"grpc_code\":14,\"http_code\":503,\"message\":\"transport is closing\","
              "\"http_status\":\"Service Unavailable\"}}", FX_EUNAVAIL, 14},
        {200, "{\"error\":{\"grpc_code\":14,\"message\":\"error reading from server: EOF\"}}",
         FX_EUNAVAIL, 14},
        /* no gRPC code: by HTTP status */
        {404, "404 page not found", FX_ENOTFOUND, -1},
        {405, "Method Not Allowed", FX_ESERVER, -1},
        {503, "<html>Service Unavailable</html>", FX_EUNAVAIL, -1},
        {401, "", FX_EAUTH, -1},
        {502, "{\"weird\":1}", FX_EUNAVAIL, -1},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        fx_ej_error e;
        fx_err got = fx_ej_parse_error(rows[i].status, P(rows[i].body), &e);
        if (got != rows[i].want)
            fail_msg("row %zu (%d %s): got %s want %s", i, rows[i].status, rows[i].body,
                     fx_errname(got), fx_errname(rows[i].want));
        assert_int_equal(e.grpc_code, rows[i].code);
        assert_int_equal(e.http_status, rows[i].status);
        if (rows[i].body[0]) assert_true(strlen(e.message) > 0);
    }
    fx_ej_error e;
    fx_ej_parse_error(400, P(EBODY("etcdserver: too many operations in txn request", 3)), &e);
    assert_string_equal(e.message, "etcdserver: too many operations in txn request");
    /* a non-JSON body becomes a printable, single-line prefix */
    fx_ej_parse_error(502, P("bad\x01gateway\nsecond line"), &e);
    assert_string_equal(e.message, "bad?gateway");
    assert_true(fx_ej_is_lease_not_found("etcdserver: requested lease not found"));
    assert_false(fx_ej_is_lease_not_found("etcdserver: permission denied"));
    assert_false(fx_ej_is_lease_not_found(NULL));
}

static void map_error_by_code(void **state)
{
    (void)state;
    assert_int_equal(fx_ej_map_error(400, 3, "etcdserver: too many operations in txn request"),
                     FX_ETXN_TOO_MANY_OPS);
    assert_int_equal(fx_ej_map_error(400, 3, NULL), FX_EINVAL);
    assert_int_equal(fx_ej_map_error(0, 16, ""), FX_EAUTH);
    assert_int_equal(fx_ej_map_error(0, 7, ""), FX_EPERM);
    assert_int_equal(fx_ej_map_error(0, 8, ""), FX_ENOSPACE);
    assert_int_equal(fx_ej_map_error(0, 9, ""), FX_EEXISTS);
    assert_int_equal(fx_ej_map_error(0, 4, ""), FX_ETIMEDOUT);
    assert_int_equal(fx_ej_map_error(0, 14, ""), FX_EUNAVAIL);
    assert_int_equal(fx_ej_map_error(0, 5, ""), FX_ENOTFOUND);
    assert_int_equal(fx_ej_map_error(0, 1, ""), FX_ECANCELED);
    assert_int_equal(fx_ej_map_error(0, 13, ""), FX_ESERVER);
    assert_int_equal(fx_ej_map_error(0, 2, ""), FX_ESERVER);
    assert_int_equal(fx_ej_map_error(500, -1, ""), FX_ESERVER);
    assert_int_equal(fx_ej_map_error(413, -1, ""), FX_ETOO_LARGE);
    assert_int_equal(fx_ej_grpc_code_by_name(P("PermissionDenied")), 7);
    assert_int_equal(fx_ej_grpc_code_by_name(P("Unauthenticated")), 16);
    assert_int_equal(fx_ej_grpc_code_by_name(P("OK")), 0);
    assert_int_equal(fx_ej_grpc_code_by_name(P("Permission")), -1);
}

/* ---- watch lines ---------------------------------------------------------------------------------- */

static void watch_created_events_progress(void **state)
{
    (void)state;
    fx_ej_watch_line l;
    assert_int_equal(fx_ej_parse_watch_line(P("{\"result\":{" HDR("1") ",\"created\":true}}\n"), &l),
                     FX_OK);
    assert_int_equal(l.kind, FX_WL_CREATED);
    assert_true(l.created);
    assert_int_equal(l.revision, 1);
    assert_int_equal(l.watch_id, 0); /* id 0 omitted */
    fx_ej_watch_line_free(&l);

    const char *put = "{\"result\":{" HDR("3") ",\"events\":[{\"kv\":{\"key\":\"am9icy8x\","
                      "\"create_revision\":\"2\",\"mod_revision\":\"3\",\"version\":\"2\","
                      "\"value\":\"Yg==\"},\"prev_kv\":{\"key\":\"am9icy8x\",\"create_revision\":"
                      "\"2\",\"mod_revision\":\"2\",\"version\":\"1\",\"value\":\"YQ==\"}}]}}\r\n";
    assert_int_equal(fx_ej_parse_watch_line(P(put), &l), FX_OK);
    assert_int_equal(l.kind, FX_WL_EVENTS);
    assert_int_equal(l.n_events, 1);
    assert_int_equal(l.events[0].type, FX_EV_PUT); /* PUT: "type" omitted */
    assert_bytes(&l.events[0].kv.key, "jobs/1");
    assert_bytes(&l.events[0].kv.value, "b");
    assert_int_equal(l.events[0].kv.mod_revision, 3);
    assert_true(l.events[0].has_prev);
    assert_bytes(&l.events[0].prev_kv.value, "a");
    fx_ej_watch_line_free(&l);
    assert_null(l.events);

    const char *del = "{\"result\":{" HDR("5") ",\"events\":[{\"type\":\"DELETE\",\"kv\":{\"key\":"
                      "\"am9icy8x\",\"mod_revision\":\"5\"},\"prev_kv\":{\"key\":\"am9icy8x\","
                      "\"create_revision\":\"2\",\"mod_revision\":\"3\",\"version\":\"2\","
                      "\"value\":\"Yg==\"}}]}}";
    assert_int_equal(fx_ej_parse_watch_line(P(del), &l), FX_OK);
    assert_int_equal(l.kind, FX_WL_EVENTS);
    assert_int_equal(l.events[0].type, FX_EV_DELETE);
    assert_bytes(&l.events[0].kv.key, "jobs/1");
    assert_bytes(&l.events[0].kv.value, "");
    assert_int_equal(l.events[0].kv.mod_revision, 5);
    fx_ej_watch_line_free(&l);

    /* history replay: two DELETE events in one response */
    const char *two = "{\"result\":{" HDR("7") ",\"events\":[{\"type\":\"DELETE\",\"kv\":{\"key\":"
                      "\"am9icy8x\",\"mod_revision\":\"5\"}},{\"type\":\"DELETE\",\"kv\":{\"key\":"
                      "\"am9icy9lcGg=\",\"mod_revision\":\"7\"}}]}}";
    assert_int_equal(fx_ej_parse_watch_line(P(two), &l), FX_OK);
    assert_int_equal(l.n_events, 2);
    assert_bytes(&l.events[1].kv.key, "jobs/eph");
    assert_int_equal(l.events[1].kv.mod_revision, 7);
    assert_false(l.events[1].has_prev);
    fx_ej_watch_line_free(&l);

    /* progress notification: header only; 3.4 also sends watch_id -1 on progress responses */
    assert_int_equal(fx_ej_parse_watch_line(P("{\"result\":{" HDR("7") "}}"), &l), FX_OK);
    assert_int_equal(l.kind, FX_WL_PROGRESS);
    assert_int_equal(l.revision, 7);
    fx_ej_watch_line_free(&l);
    assert_int_equal(fx_ej_parse_watch_line(P("{\"result\":{" HDR("7") ",\"watch_id\":\"-1\"}}"),
                                            &l), FX_OK);
    assert_int_equal(l.kind, FX_WL_PROGRESS);
    assert_int_equal(l.watch_id, -1);
    fx_ej_watch_line_free(&l);
}

static void watch_canceled_and_errors(void **state)
{
    (void)state;
    fx_ej_watch_line l;
    /* compaction: no revision in the header */
    const char *comp = "{\"result\":{\"header\":{\"cluster_id\":\"1\",\"member_id\":\"2\","
                       "\"raft_term\":\"2\"},\"canceled\":true,\"compact_revision\":\"9\"}}";
    assert_int_equal(fx_ej_parse_watch_line(P(comp), &l), FX_OK);
    assert_int_equal(l.kind, FX_WL_CANCELED);
    assert_int_equal(l.compact_revision, 9);
    assert_int_equal(l.revision, 0);
    assert_int_equal(l.err, FX_ECOMPACTED);
    fx_ej_watch_line_free(&l);

    const char *dup = "{\"result\":{" HDR("7") ",\"watch_id\":\"-1\",\"created\":true,\"canceled\":"
                      "true,\"cancel_reason\":\"mvcc: duplicate watch ID provided on the "
                      "WatchStream\"}}";
    assert_int_equal(fx_ej_parse_watch_line(P(dup), &l), FX_OK);
    assert_int_equal(l.kind, FX_WL_CANCELED);
    assert_true(l.created);
    assert_int_equal(l.err, FX_ECANCELED);
    assert_non_null(strstr(l.reason, "duplicate watch ID"));
    fx_ej_watch_line_free(&l);

    const char *perm = "{\"result\":{" HDR("7") ",\"watch_id\":\"-1\",\"created\":true,\"canceled\":"
                       "true,\"cancel_reason\":\"rpc error: code = PermissionDenied desc = "
                       "etcdserver: permission denied\"}}";
    assert_int_equal(fx_ej_parse_watch_line(P(perm), &l), FX_OK);
    assert_int_equal(l.err, FX_EPERM);
    assert_int_equal(l.grpc_code, 7);
    fx_ej_watch_line_free(&l);

    const char *noname = "{\"result\":{" HDR("7") ",\"watch_id\":\"-1\",\"created\":true,"
                         "\"canceled\":true,\"cancel_reason\":\"rpc error: code = InvalidArgument "
                         "desc = etcdserver: user name is empty\"}}";
    assert_int_equal(fx_ej_parse_watch_line(P(noname), &l), FX_OK);
    assert_int_equal(l.err, FX_EAUTH);
    fx_ej_watch_line_free(&l);

    const char *se = "{\"error\":{\"grpc_code\":14,\"http_code\":503,\"message\":\"transport is "
                     "closing\",\"http_status\":\"Service Unavailable\"}}\n";
    assert_int_equal(fx_ej_parse_watch_line(P(se), &l), FX_OK);
    assert_int_equal(l.kind, FX_WL_ERROR);
    assert_int_equal(l.grpc_code, 14);
    assert_int_equal(l.err, FX_EUNAVAIL);
    assert_string_equal(l.reason, "transport is closing");
    fx_ej_watch_line_free(&l);
    /* unary-shaped error on the stream */
    assert_int_equal(fx_ej_parse_watch_line(P(EBODY("illegal base64 data at input byte 0", 2)), &l),
                     FX_OK);
    assert_int_equal(l.kind, FX_WL_ERROR);
    assert_int_equal(l.err, FX_ESERVER);
    fx_ej_watch_line_free(&l);

    /* garbage */
    assert_int_equal(fx_ej_parse_watch_line(P("{\"nope\":1}"), &l), FX_EPROTO);
    assert_int_equal(fx_ej_parse_watch_line(P("{\"result\":{\"events\":[{\"type\":\"BOOM\","
                                              "\"kv\":{\"key\":\"YQ==\"}}]}}"), &l), FX_EPROTO);
    assert_null(l.events);
    assert_int_equal(fx_ej_parse_watch_line(P("{\"result\":{\"events\":[{\"kv\":{\"key\":\"YQ==\"}},"
                                              "{\"type\":\"DELETE\"}]}}"), &l), FX_EPROTO);
    assert_null(l.events);
    assert_int_equal(l.n_events, 0);
    assert_int_equal(fx_ej_parse_watch_line(P("{\"result\":{\"created\":true"), &l), FX_EPROTO);
}

/* ---- request building ------------------------------------------------------------------------------ */

static void build_range_request(void **state)
{
    (void)state;
    uint8_t end[8];
    size_t n = fx_prefix_end(FX_SLICE_STR("app/"), end);
    fx_range_req r = {.key = FX_SLICE_STR("app/"), .range_end = {end, n}, .limit = 10,
                      .revision = 5, .keys_only = true, .serializable = true,
                      .sort_order = FX_SORT_DESCEND, .sort_target = FX_SORT_MOD};
    char *txt = NULL;
    assert_int_equal(fx_ej_range_req(&r, &txt), FX_OK);
    cJSON *j = parse_req(txt);
    assert_string_equal(jstr(j, "key"), "YXBwLw==");
    assert_string_equal(jstr(j, "range_end"), "YXBwMA==");
    assert_string_equal(jstr(j, "limit"), "10"); /* int64 as a string */
    assert_string_equal(jstr(j, "revision"), "5");
    assert_true(cJSON_IsTrue(jget(j, "keys_only")));
    assert_true(cJSON_IsTrue(jget(j, "serializable")));
    assert_null(jget(j, "count_only")); /* false -> omitted */
    assert_string_equal(jstr(j, "sort_order"), "DESCEND");
    assert_string_equal(jstr(j, "sort_target"), "MOD");
    cJSON_Delete(j);

    fx_range_req min = {.key = FX_SLICE_STR("k")};
    assert_int_equal(fx_ej_range_req(&min, &txt), FX_OK);
    assert_string_equal(txt, "{\"key\":\"aw==\"}");
    free(txt);
    /* ascending by key is etcd's natural order: no sort sent (a sorted range reads every key) */
    fx_range_req ka = {.key = FX_SLICE_STR("k"), .sort_order = FX_SORT_ASCEND, .sort_target = FX_SORT_KEY};
    assert_int_equal(fx_ej_range_req(&ka, &txt), FX_OK);
    assert_string_equal(txt, "{\"key\":\"aw==\"}");
    free(txt);

    fx_range_req empty = {.key = {NULL, 0}};
    assert_int_equal(fx_ej_range_req(&empty, &txt), FX_EINVAL);
    assert_null(txt);
    fx_range_req badsort = {.key = FX_SLICE_STR("k"), .sort_order = (fx_sort_order)7};
    assert_int_equal(fx_ej_range_req(&badsort, &txt), FX_EINVAL);
    assert_null(txt);
}

static void build_put_and_delete_requests(void **state)
{
    (void)state;
    const uint8_t key[] = {0x00, 0xff, 'a'};
    const uint8_t val[] = {0xff, 0x00};
    fx_put_req p = {.key = {key, 3}, .value = {val, 2}, .lease = INT64_C(4611686018427387905),
                    .prev_kv = true};
    char *txt = NULL;
    assert_int_equal(fx_ej_put_req(&p, &txt), FX_OK);
    cJSON *j = parse_req(txt);
    assert_string_equal(jstr(j, "key"), "AP9h");
    assert_string_equal(jstr(j, "value"), "/wA=");
    /* 2^62+1 would not survive a double: it must be an exact string */
    assert_string_equal(jstr(j, "lease"), "4611686018427387905");
    assert_true(cJSON_IsTrue(jget(j, "prev_kv")));
    assert_null(jget(j, "ignore_lease"));
    cJSON_Delete(j);

    fx_put_req keep = {.key = FX_SLICE_STR("a"), .value = FX_SLICE_STR("ignored"),
                       .ignore_value = true, .ignore_lease = true};
    assert_int_equal(fx_ej_put_req(&keep, &txt), FX_OK);
    j = parse_req(txt);
    assert_null(jget(j, "value"));
    assert_null(jget(j, "lease"));
    assert_true(cJSON_IsTrue(jget(j, "ignore_value")));
    assert_true(cJSON_IsTrue(jget(j, "ignore_lease")));
    cJSON_Delete(j);

    uint8_t end[1];
    size_t n = fx_prefix_end((fx_slice){"\xff", 1}, end);
    fx_del_req d = {.key = FX_SLICE_STR("a"), .range_end = {end, n}, .prev_kv = true};
    assert_int_equal(fx_ej_del_req(&d, &txt), FX_OK);
    j = parse_req(txt);
    assert_string_equal(jstr(j, "key"), "YQ==");
    assert_string_equal(jstr(j, "range_end"), "AA=="); /* "\0": to the end */
    assert_true(cJSON_IsTrue(jget(j, "prev_kv")));
    cJSON_Delete(j);

    fx_del_req bad = {.key = {NULL, 0}};
    assert_int_equal(fx_ej_del_req(&bad, &txt), FX_EINVAL);
}

static void build_txn_request(void **state)
{
    (void)state;
    fx_cmp cmp[] = {
        {.target = FX_CMP_CREATE, .result = FX_CMP_EQUAL, .key = FX_SLICE_STR("txn/k"), .num = 0},
        {.target = FX_CMP_VERSION, .result = FX_CMP_GREATER, .key = FX_SLICE_STR("txn/k"), .num = 1},
        {.target = FX_CMP_VALUE, .result = FX_CMP_EQUAL, .key = FX_SLICE_STR("txn/k"),
         .value = FX_SLICE_STR("two")},
        {.target = FX_CMP_LEASE, .result = FX_CMP_NOT_EQUAL, .key = FX_SLICE_STR("txn/k"), .num = 0},
        {.target = FX_CMP_MOD, .result = FX_CMP_LESS, .key = FX_SLICE_STR("txn/"),
         .range_end = FX_SLICE_STR("txn0"), .num = 1000000},
    };
    fx_op ok_ops[3];
    memset(ok_ops, 0, sizeof ok_ops);
    ok_ops[0].type = FX_OP_PUT;
    ok_ops[0].u.put = (fx_put_req){.key = FX_SLICE_STR("txn/k"), .value = FX_SLICE_STR("one"),
                                   .lease = 7587867300000001};
    ok_ops[1].type = FX_OP_DELETE;
    ok_ops[1].u.del = (fx_del_req){.key = FX_SLICE_STR("txn/other")};
    ok_ops[2].type = FX_OP_RANGE;
    ok_ops[2].u.range = (fx_range_req){.key = FX_SLICE_STR("txn/k"), .count_only = true};
    fx_op fail_ops[1];
    memset(fail_ops, 0, sizeof fail_ops);
    fail_ops[0].type = FX_OP_RANGE;
    fail_ops[0].u.range = (fx_range_req){.key = FX_SLICE_STR("txn/k")};
    fx_txn_req t = {.cmp = cmp, .n_cmp = 5, .success = ok_ops, .n_success = 3,
                    .failure = fail_ops, .n_failure = 1};
    char *txt = NULL;
    assert_int_equal(fx_ej_txn_req(&t, &txt), FX_OK);
    cJSON *j = parse_req(txt);
    assert_int_equal(cJSON_GetArraySize(jget(j, "compare")), 5);
    assert_string_equal(jstr(j, "compare.0.target"), "CREATE");
    assert_string_equal(jstr(j, "compare.0.result"), "EQUAL");
    assert_string_equal(jstr(j, "compare.0.key"), "dHhuL2s=");
    assert_string_equal(jstr(j, "compare.0.create_revision"), "0"); /* sent even when 0 */
    assert_string_equal(jstr(j, "compare.1.target"), "VERSION");
    assert_string_equal(jstr(j, "compare.1.result"), "GREATER");
    assert_string_equal(jstr(j, "compare.1.version"), "1");
    assert_string_equal(jstr(j, "compare.2.target"), "VALUE");
    assert_string_equal(jstr(j, "compare.2.value"), "dHdv");
    assert_string_equal(jstr(j, "compare.3.target"), "LEASE");
    assert_string_equal(jstr(j, "compare.3.result"), "NOT_EQUAL");
    assert_string_equal(jstr(j, "compare.3.lease"), "0");
    assert_string_equal(jstr(j, "compare.4.target"), "MOD");
    assert_string_equal(jstr(j, "compare.4.result"), "LESS");
    assert_string_equal(jstr(j, "compare.4.range_end"), "dHhuMA==");
    assert_string_equal(jstr(j, "compare.4.mod_revision"), "1000000");
    assert_string_equal(jstr(j, "success.0.request_put.key"), "dHhuL2s=");
    assert_string_equal(jstr(j, "success.0.request_put.value"), "b25l");
    assert_string_equal(jstr(j, "success.0.request_put.lease"), "7587867300000001");
    assert_string_equal(jstr(j, "success.1.request_delete_range.key"), "dHhuL290aGVy");
    assert_true(cJSON_IsTrue(jget(j, "success.2.request_range.count_only")));
    assert_string_equal(jstr(j, "failure.0.request_range.key"), "dHhuL2s=");
    cJSON_Delete(j);

    /* an empty txn is "{}" (etcd answers succeeded:true) */
    fx_txn_req none = {0};
    assert_int_equal(fx_ej_txn_req(&none, &txt), FX_OK);
    assert_string_equal(txt, "{}");
    free(txt);

    /* invalid pieces anywhere are refused, and nothing leaks (ASan/valgrind) */
    fail_ops[0].u.range.key = (fx_slice){NULL, 0};
    assert_int_equal(fx_ej_txn_req(&t, &txt), FX_EINVAL);
    assert_null(txt);
    fail_ops[0].u.range.key = FX_SLICE_STR("txn/k");
    cmp[4].target = (fx_cmp_target)9;
    assert_int_equal(fx_ej_txn_req(&t, &txt), FX_EINVAL);
    cmp[4].target = FX_CMP_MOD;
    ok_ops[1].type = (fx_op_type)5;
    assert_int_equal(fx_ej_txn_req(&t, &txt), FX_EINVAL);
    ok_ops[1].type = FX_OP_DELETE;
    fx_txn_req nullcmp = {.cmp = NULL, .n_cmp = 1};
    assert_int_equal(fx_ej_txn_req(&nullcmp, &txt), FX_EINVAL);
}

static void build_lease_watch_auth_compact(void **state)
{
    (void)state;
    char *txt = NULL;
    assert_int_equal(fx_ej_lease_grant_req(30, 0, &txt), FX_OK);
    assert_string_equal(txt, "{\"TTL\":\"30\"}");
    free(txt);
    assert_int_equal(fx_ej_lease_grant_req(30, 7587867300000001, &txt), FX_OK);
    assert_string_equal(txt, "{\"TTL\":\"30\",\"ID\":\"7587867300000001\"}");
    free(txt);
    assert_int_equal(fx_ej_lease_id_req(INT64_C(5241523851781477701), &txt), FX_OK);
    assert_string_equal(txt, "{\"ID\":\"5241523851781477701\"}");
    free(txt);
    assert_int_equal(fx_ej_compact_req(12, true, &txt), FX_OK);
    assert_string_equal(txt, "{\"revision\":\"12\",\"physical\":true}");
    free(txt);
    assert_int_equal(fx_ej_auth_req("app", "apppw", &txt), FX_OK);
    assert_string_equal(txt, "{\"name\":\"app\",\"password\":\"apppw\"}");
    free(txt);
    assert_int_equal(fx_ej_auth_req(NULL, "x", &txt), FX_EINVAL);

    fx_ej_watch_create w = {.key = FX_SLICE_STR("jobs/"), .range_end = FX_SLICE_STR("jobs0"),
                            .start_revision = 2, .prev_kv = true, .progress_notify = true};
    assert_int_equal(fx_ej_watch_create_req(&w, &txt), FX_OK);
    cJSON *j = parse_req(txt);
    assert_string_equal(jstr(j, "create_request.key"), "am9icy8=");
    assert_string_equal(jstr(j, "create_request.range_end"), "am9iczA=");
    assert_string_equal(jstr(j, "create_request.start_revision"), "2");
    assert_true(cJSON_IsTrue(jget(j, "create_request.prev_kv")));
    assert_true(cJSON_IsTrue(jget(j, "create_request.progress_notify")));
    cJSON_Delete(j);
    fx_ej_watch_create w0 = {.key = FX_SLICE_STR("a")};
    assert_int_equal(fx_ej_watch_create_req(&w0, &txt), FX_OK);
    assert_string_equal(txt, "{\"create_request\":{\"key\":\"YQ==\"}}");
    free(txt);
    fx_ej_watch_create wbad = {.key = {NULL, 0}};
    assert_int_equal(fx_ej_watch_create_req(&wbad, &txt), FX_EINVAL);
}

static void prefix_end_rules(void **state)
{
    (void)state;
    uint8_t out[8];
    size_t n = fx_prefix_end(FX_SLICE_STR("app/"), out);
    assert_int_equal(n, 4);
    assert_memory_equal(out, "app0", 4);
    n = fx_prefix_end((fx_slice){"a\xff\xff", 3}, out);
    assert_int_equal(n, 1);
    assert_int_equal(out[0], 'b');
    n = fx_prefix_end((fx_slice){"\x01\xfe\xff", 3}, out);
    assert_int_equal(n, 2);
    assert_memory_equal(out, "\x01\xff", 2);
    n = fx_prefix_end((fx_slice){"\xff\xff", 2}, out);
    assert_int_equal(n, 1);
    assert_int_equal(out[0], 0);
    n = fx_prefix_end((fx_slice){NULL, 0}, out);
    assert_int_equal(n, 1);
    assert_int_equal(out[0], 0);
}

static void free_functions_are_null_and_zero_safe(void **state)
{
    (void)state;
    fx_bytes_free(NULL);
    fx_kv_free(NULL);
    fx_range_resp_free(NULL);
    fx_put_resp_free(NULL);
    fx_del_resp_free(NULL);
    fx_txn_resp_free(NULL);
    fx_event_free(NULL);
    fx_ej_watch_line_free(NULL);
    fx_range_resp r;
    memset(&r, 0, sizeof r);
    fx_range_resp_free(&r);
    fx_txn_resp t;
    memset(&t, 0, sizeof t);
    fx_txn_resp_free(&t);
    fx_kv kv;
    memset(&kv, 0, sizeof kv);
    fx_kv_free(&kv);
    assert_null(kv.key.data);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(range_prefix_with_kvs_and_count),
        cmocka_unit_test(range_limit_more_and_keys_only),
        cmocka_unit_test(range_missing_key_and_count_only),
        cmocka_unit_test(range_historical_with_lease),
        cmocka_unit_test(range_binary_key_and_value),
        cmocka_unit_test(put_first_write_and_prev_kv),
        cmocka_unit_test(deleterange_with_and_without_deleted),
        cmocka_unit_test(txn_succeeded_with_put),
        cmocka_unit_test(txn_failed_has_no_succeeded),
        cmocka_unit_test(txn_multi_op_responses),
        cmocka_unit_test(txn_nested_and_empty),
        cmocka_unit_test(lease_grant_keepalive_timetolive),
        cmocka_unit_test(status_and_auth),
        cmocka_unit_test(wrong_types_and_garbage_are_eproto),
        cmocka_unit_test(lenient_where_the_wire_allows),
        cmocka_unit_test(body_over_the_cap_is_refused),
        cmocka_unit_test(error_table_maps_every_row),
        cmocka_unit_test(map_error_by_code),
        cmocka_unit_test(watch_created_events_progress),
        cmocka_unit_test(watch_canceled_and_errors),
        cmocka_unit_test(build_range_request),
        cmocka_unit_test(build_put_and_delete_requests),
        cmocka_unit_test(build_txn_request),
        cmocka_unit_test(build_lease_watch_auth_compact),
        cmocka_unit_test(prefix_end_rules),
        cmocka_unit_test(free_functions_are_null_and_zero_safe),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
