/* etcd_json.c -- codecs for the etcd v3 JSON gateway (contract in etcd_json.h). */
#include "etcd_json.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fx_b64.h"

/* ==== data model of etcd.h ====================================================================== */

void fx_bytes_free(fx_bytes *b)
{
    if (!b) return;
    free(b->data);
    b->data = NULL;
    b->len = 0;
}

void fx_kv_free(fx_kv *kv)
{
    if (!kv) return;
    fx_bytes_free(&kv->key);
    fx_bytes_free(&kv->value);
    memset(kv, 0, sizeof *kv);
}

static void kvs_free(fx_kv *kvs, size_t n)
{
    for (size_t i = 0; i < n; i++) fx_kv_free(&kvs[i]);
    free(kvs);
}

void fx_range_resp_free(fx_range_resp *r)
{
    if (!r) return;
    kvs_free(r->kvs, r->n_kvs);
    memset(r, 0, sizeof *r);
}

void fx_put_resp_free(fx_put_resp *r)
{
    if (!r) return;
    fx_kv_free(&r->prev_kv);
    memset(r, 0, sizeof *r);
}

void fx_del_resp_free(fx_del_resp *r)
{
    if (!r) return;
    kvs_free(r->prev_kvs, r->n_prev_kvs);
    memset(r, 0, sizeof *r);
}

static void op_resp_free(fx_op_resp *o)
{
    switch (o->type) {
    case FX_OP_RANGE: fx_range_resp_free(&o->u.range); break;
    case FX_OP_PUT: fx_put_resp_free(&o->u.put); break;
    case FX_OP_DELETE: fx_del_resp_free(&o->u.del); break;
    }
}

void fx_txn_resp_free(fx_txn_resp *r)
{
    if (!r) return;
    for (size_t i = 0; i < r->n_responses; i++) op_resp_free(&r->responses[i]);
    free(r->responses);
    memset(r, 0, sizeof *r);
}

void fx_event_free(fx_event *ev)
{
    if (!ev) return;
    fx_kv_free(&ev->kv);
    fx_kv_free(&ev->prev_kv);
    ev->has_prev = false;
}

void fx_ej_watch_line_free(fx_ej_watch_line *l)
{
    if (!l) return;
    for (size_t i = 0; i < l->n_events; i++) fx_event_free(&l->events[i]);
    free(l->events);
    memset(l, 0, sizeof *l);
    l->grpc_code = -1;
}

size_t fx_prefix_end(fx_slice prefix, uint8_t *out)
{
    const uint8_t *p = prefix.data;
    size_t n = prefix.len;
    /* Trailing 0xff bytes cannot be incremented: drop them and carry into the byte before. */
    while (n > 0 && p[n - 1] == 0xff) n--;
    if (n == 0) {
        out[0] = 0; /* "\0" as range_end: to the end of the keyspace */
        return 1;
    }
    memcpy(out, p, n);
    out[n - 1]++;
    return n;
}

/* ==== request bodies ============================================================================= */

static const char *const sort_order_names[] = {"NONE", "ASCEND", "DESCEND"};
static const char *const sort_target_names[] = {"KEY", "VERSION", "CREATE", "MOD", "VALUE"};
static const char *const cmp_target_names[] = {"VERSION", "CREATE", "MOD", "VALUE", "LEASE"};
static const char *const cmp_result_names[] = {"EQUAL", "GREATER", "LESS", "NOT_EQUAL"};
/* Name of the compare's value field per target: the proto oneof, not the target name. */
static const char *const cmp_field_names[] = {"version", "create_revision", "mod_revision",
                                              "value", "lease"};

#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

static bool slice_ok(fx_slice s) { return s.len == 0 || s.data != NULL; }

static bool add_i64(cJSON *o, const char *name, int64_t v)
{
    char buf[24];
    snprintf(buf, sizeof buf, "%" PRId64, v);
    return cJSON_AddStringToObject(o, name, buf) != NULL;
}

static bool add_bool(cJSON *o, const char *name) { return cJSON_AddTrueToObject(o, name) != NULL; }

static bool add_b64(cJSON *o, const char *name, fx_slice s)
{
    char *buf = malloc(fx_b64_enc_len(s.len) + 1);
    if (!buf) return false;
    fx_b64_encode(s.data, s.len, buf);
    bool ok = cJSON_AddStringToObject(o, name, buf) != NULL;
    free(buf);
    return ok;
}

/* Serialise root (consumed) into *out. */
static fx_err finish(cJSON *root, bool ok, char **out)
{
    *out = NULL;
    if (ok) *out = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!*out) return fx_seterr(FX_ENOMEM, "out of memory building an etcd request");
    return FX_OK;
}

static fx_err range_obj(const fx_range_req *r, cJSON *o)
{
    if (r->key.len == 0 || !slice_ok(r->key) || !slice_ok(r->range_end))
        return fx_seterr(FX_EINVAL, "range: empty key");
    if ((unsigned)r->sort_order >= NELEM(sort_order_names) ||
        (unsigned)r->sort_target >= NELEM(sort_target_names))
        return fx_seterr(FX_EINVAL, "range: bad sort order/target");
    bool ok = add_b64(o, "key", r->key);
    if (r->range_end.len) ok = ok && add_b64(o, "range_end", r->range_end);
    if (r->limit) ok = ok && add_i64(o, "limit", r->limit);
    if (r->revision) ok = ok && add_i64(o, "revision", r->revision);
    if (r->count_only) ok = ok && add_bool(o, "count_only");
    if (r->keys_only) ok = ok && add_bool(o, "keys_only");
    if (r->serializable) ok = ok && add_bool(o, "serializable");
    /* Ascending by key is etcd's natural order: sent as no sort (fx_range_req) */
    if ((r->sort_order != FX_SORT_NONE || r->sort_target != FX_SORT_KEY) &&
        !(r->sort_order == FX_SORT_ASCEND && r->sort_target == FX_SORT_KEY)) {
        ok = ok && cJSON_AddStringToObject(o, "sort_order", sort_order_names[r->sort_order]);
        ok = ok && cJSON_AddStringToObject(o, "sort_target", sort_target_names[r->sort_target]);
    }
    return ok ? FX_OK : fx_seterr(FX_ENOMEM, "out of memory building an etcd request");
}

static fx_err put_obj(const fx_put_req *r, cJSON *o)
{
    if (r->key.len == 0 || !slice_ok(r->key) || !slice_ok(r->value))
        return fx_seterr(FX_EINVAL, "put: empty key");
    bool ok = add_b64(o, "key", r->key);
    if (!r->ignore_value && r->value.len) ok = ok && add_b64(o, "value", r->value);
    if (r->lease) ok = ok && add_i64(o, "lease", r->lease);
    if (r->prev_kv) ok = ok && add_bool(o, "prev_kv");
    if (r->ignore_value) ok = ok && add_bool(o, "ignore_value");
    if (r->ignore_lease) ok = ok && add_bool(o, "ignore_lease");
    return ok ? FX_OK : fx_seterr(FX_ENOMEM, "out of memory building an etcd request");
}

static fx_err del_obj(const fx_del_req *r, cJSON *o)
{
    if (r->key.len == 0 || !slice_ok(r->key) || !slice_ok(r->range_end))
        return fx_seterr(FX_EINVAL, "delete: empty key");
    bool ok = add_b64(o, "key", r->key);
    if (r->range_end.len) ok = ok && add_b64(o, "range_end", r->range_end);
    if (r->prev_kv) ok = ok && add_bool(o, "prev_kv");
    return ok ? FX_OK : fx_seterr(FX_ENOMEM, "out of memory building an etcd request");
}

static fx_err cmp_obj(const fx_cmp *c, cJSON *o)
{
    if (c->key.len == 0 || !slice_ok(c->key) || !slice_ok(c->range_end) || !slice_ok(c->value))
        return fx_seterr(FX_EINVAL, "txn compare: empty key");
    if ((unsigned)c->target >= NELEM(cmp_target_names) ||
        (unsigned)c->result >= NELEM(cmp_result_names))
        return fx_seterr(FX_EINVAL, "txn compare: bad target/result");
    bool ok = cJSON_AddStringToObject(o, "target", cmp_target_names[c->target]) != NULL;
    ok = ok && cJSON_AddStringToObject(o, "result", cmp_result_names[c->result]);
    ok = ok && add_b64(o, "key", c->key);
    if (c->range_end.len) ok = ok && add_b64(o, "range_end", c->range_end);
    /* The operand is always sent, also when it is 0 or empty (the gateway needs the oneof set). */
    if (c->target == FX_CMP_VALUE)
        ok = ok && add_b64(o, cmp_field_names[c->target], c->value);
    else
        ok = ok && add_i64(o, cmp_field_names[c->target], c->num);
    return ok ? FX_OK : fx_seterr(FX_ENOMEM, "out of memory building an etcd request");
}

static fx_err op_obj(const fx_op *op, cJSON *o)
{
    cJSON *inner = cJSON_CreateObject();
    if (!inner) return fx_seterr(FX_ENOMEM, "out of memory building an etcd request");
    const char *name;
    fx_err e;
    switch (op->type) {
    case FX_OP_RANGE: name = "request_range"; e = range_obj(&op->u.range, inner); break;
    case FX_OP_PUT: name = "request_put"; e = put_obj(&op->u.put, inner); break;
    case FX_OP_DELETE: name = "request_delete_range"; e = del_obj(&op->u.del, inner); break;
    default:
        cJSON_Delete(inner);
        return fx_seterr(FX_EINVAL, "txn: bad op type %d", (int)op->type);
    }
    if (e != FX_OK) {
        cJSON_Delete(inner);
        return e;
    }
    if (!cJSON_AddItemToObject(o, name, inner)) {
        cJSON_Delete(inner);
        return fx_seterr(FX_ENOMEM, "out of memory building an etcd request");
    }
    return FX_OK;
}

/* Append n objects built by fn to a new array member `name` (omitted when n == 0). */
static fx_err add_array(cJSON *root, const char *name, const void *items, size_t n, size_t size,
                        fx_err (*fn)(const void *item, cJSON *o))
{
    if (n == 0) return FX_OK;
    if (!items) return fx_seterr(FX_EINVAL, "txn: %s is NULL", name);
    cJSON *arr = cJSON_AddArrayToObject(root, name);
    if (!arr) return fx_seterr(FX_ENOMEM, "out of memory building an etcd request");
    for (size_t i = 0; i < n; i++) {
        cJSON *o = cJSON_CreateObject();
        if (!o) return fx_seterr(FX_ENOMEM, "out of memory building an etcd request");
        cJSON_AddItemToArray(arr, o); /* owned by arr from here on */
        fx_err e = fn((const char *)items + i * size, o);
        if (e != FX_OK) return e;
    }
    return FX_OK;
}

static fx_err cmp_fn(const void *item, cJSON *o) { return cmp_obj(item, o); }
static fx_err op_fn(const void *item, cJSON *o) { return op_obj(item, o); }

/* Build the body of one request struct with fn into *out. */
static fx_err build(const void *req, fx_err (*fn)(const void *req, cJSON *o), char **out)
{
    *out = NULL;
    cJSON *root = cJSON_CreateObject();
    if (!root) return fx_seterr(FX_ENOMEM, "out of memory building an etcd request");
    fx_err e = fn(req, root);
    if (e != FX_OK) {
        cJSON_Delete(root);
        return e;
    }
    return finish(root, true, out);
}

static fx_err range_fn(const void *r, cJSON *o) { return range_obj(r, o); }
static fx_err put_fn(const void *r, cJSON *o) { return put_obj(r, o); }
static fx_err del_fn(const void *r, cJSON *o) { return del_obj(r, o); }

static fx_err txn_fn(const void *req, cJSON *o)
{
    const fx_txn_req *r = req;
    fx_err e = add_array(o, "compare", r->cmp, r->n_cmp, sizeof *r->cmp, cmp_fn);
    if (e == FX_OK) e = add_array(o, "success", r->success, r->n_success, sizeof *r->success, op_fn);
    if (e == FX_OK) e = add_array(o, "failure", r->failure, r->n_failure, sizeof *r->failure, op_fn);
    return e;
}

fx_err fx_ej_range_req(const fx_range_req *r, char **out) { return build(r, range_fn, out); }
fx_err fx_ej_put_req(const fx_put_req *r, char **out) { return build(r, put_fn, out); }
fx_err fx_ej_del_req(const fx_del_req *r, char **out) { return build(r, del_fn, out); }
fx_err fx_ej_txn_req(const fx_txn_req *r, char **out) { return build(r, txn_fn, out); }

fx_err fx_ej_lease_grant_req(int64_t ttl_s, int64_t id, char **out)
{
    cJSON *root = cJSON_CreateObject();
    bool ok = root && add_i64(root, "TTL", ttl_s);
    if (id) ok = ok && add_i64(root, "ID", id);
    return finish(root, ok, out);
}

fx_err fx_ej_lease_id_req(int64_t id, char **out)
{
    cJSON *root = cJSON_CreateObject();
    bool ok = root && add_i64(root, "ID", id);
    return finish(root, ok, out);
}

fx_err fx_ej_compact_req(int64_t revision, bool physical, char **out)
{
    cJSON *root = cJSON_CreateObject();
    bool ok = root && add_i64(root, "revision", revision);
    if (physical) ok = ok && add_bool(root, "physical");
    return finish(root, ok, out);
}

fx_err fx_ej_auth_req(const char *name, const char *password, char **out)
{
    *out = NULL;
    if (!name || !password) return fx_seterr(FX_EINVAL, "auth: missing user name or password");
    cJSON *root = cJSON_CreateObject();
    bool ok = root && cJSON_AddStringToObject(root, "name", name);
    ok = ok && cJSON_AddStringToObject(root, "password", password);
    return finish(root, ok, out);
}

fx_err fx_ej_watch_create_req(const fx_ej_watch_create *w, char **out)
{
    *out = NULL;
    if (w->key.len == 0 || !slice_ok(w->key) || !slice_ok(w->range_end))
        return fx_seterr(FX_EINVAL, "watch: empty key");
    cJSON *root = cJSON_CreateObject();
    cJSON *cr = root ? cJSON_AddObjectToObject(root, "create_request") : NULL;
    bool ok = cr && add_b64(cr, "key", w->key);
    if (w->range_end.len) ok = ok && add_b64(cr, "range_end", w->range_end);
    if (w->start_revision) ok = ok && add_i64(cr, "start_revision", w->start_revision);
    if (w->prev_kv) ok = ok && add_bool(cr, "prev_kv");
    if (w->progress_notify) ok = ok && add_bool(cr, "progress_notify");
    return finish(root, ok, out);
}

/* ==== response parsing =========================================================================== */

static fx_err bad(const char *field)
{
    return fx_seterr(FX_EPROTO, "malformed etcd response: bad field \"%s\"", field);
}

static fx_err parse_root(const char *body, size_t len, cJSON **out)
{
    *out = NULL;
    if (len > FX_EJ_MAX_BODY)
        return fx_seterr(FX_EPROTO, "etcd response too large (%zu bytes)", len);
    if (!body || len == 0) return fx_seterr(FX_EPROTO, "empty etcd response");
    cJSON *j = cJSON_ParseWithLength(body, len);
    if (!j) return fx_seterr(FX_EPROTO, "etcd response is not JSON (%zu bytes)", len);
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return fx_seterr(FX_EPROTO, "etcd response is not a JSON object");
    }
    *out = j;
    return FX_OK;
}

static const cJSON *member(const cJSON *o, const char *name)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, name);
    return (it && !cJSON_IsNull(it)) ? it : NULL; /* null counts as absent */
}

/* Parse a decimal int64 string strictly. With as_unsigned, values up to UINT64_MAX are accepted
 * and stored as their two's complement bit pattern (member and cluster ids are uint64). */
static bool str_to_i64(const char *s, bool as_unsigned, int64_t *out)
{
    if (!((*s >= '0' && *s <= '9') || (*s == '-' && s[1] >= '0' && s[1] <= '9'))) return false;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno == ERANGE && as_unsigned && *s != '-') {
        errno = 0;
        unsigned long long u = strtoull(s, &end, 10);
        if (errno || *end) return false;
        *out = (int64_t)u;
        return true;
    }
    if (errno || *end) return false;
    *out = v;
    return true;
}

static fx_err get_int(const cJSON *o, const char *name, bool as_unsigned, int64_t *out)
{
    *out = 0;
    const cJSON *it = member(o, name);
    if (!it) return FX_OK;
    if (cJSON_IsString(it)) {
        if (!str_to_i64(it->valuestring, as_unsigned, out)) return bad(name);
        return FX_OK;
    }
    if (cJSON_IsNumber(it)) {
        /* Only exact integers are trusted from a double. */
        double d = it->valuedouble;
        if (!(d >= -9007199254740992.0 && d <= 9007199254740992.0) || (double)(int64_t)d != d)
            return bad(name);
        *out = (int64_t)d;
        return FX_OK;
    }
    return bad(name);
}

static fx_err get_i64(const cJSON *o, const char *name, int64_t *out)
{
    return get_int(o, name, false, out);
}

static fx_err get_bool(const cJSON *o, const char *name, bool *out)
{
    *out = false;
    const cJSON *it = member(o, name);
    if (!it) return FX_OK;
    if (!cJSON_IsBool(it)) return bad(name);
    *out = cJSON_IsTrue(it);
    return FX_OK;
}

/* Optional object member: *out NULL when absent. */
static fx_err get_obj(const cJSON *o, const char *name, const cJSON **out)
{
    *out = member(o, name);
    if (*out && !cJSON_IsObject(*out)) return bad(name);
    return FX_OK;
}

static fx_err get_arr(const cJSON *o, const char *name, const cJSON **out)
{
    *out = member(o, name);
    if (*out && !cJSON_IsArray(*out)) return bad(name);
    return FX_OK;
}

/* Optional base64 member into an owned, NUL-terminated buffer (absent: empty). */
static fx_err get_bytes(const cJSON *o, const char *name, fx_bytes *out)
{
    out->data = NULL;
    out->len = 0;
    const cJSON *it = member(o, name);
    const char *s = "";
    if (it) {
        if (!cJSON_IsString(it)) return bad(name);
        s = it->valuestring;
    }
    size_t n = strlen(s);
    uint8_t *buf = malloc(fx_b64_dec_maxlen(n) + 1);
    if (!buf) return fx_seterr(FX_ENOMEM, "out of memory parsing an etcd response");
    size_t len = 0;
    if (fx_b64_decode(s, n, buf, &len) != 0) {
        free(buf);
        return fx_seterr(FX_EPROTO, "malformed etcd response: invalid base64 in \"%s\"", name);
    }
    buf[len] = '\0';
    out->data = buf;
    out->len = len;
    return FX_OK;
}

static fx_err header_rev(const cJSON *o, int64_t *rev)
{
    const cJSON *h;
    *rev = 0;
    fx_err e = get_obj(o, "header", &h);
    if (e == FX_OK && h) e = get_i64(h, "revision", rev);
    return e;
}

static fx_err parse_kv(const cJSON *o, fx_kv *kv)
{
    memset(kv, 0, sizeof *kv);
    if (!cJSON_IsObject(o)) return bad("kv");
    fx_err e = get_bytes(o, "key", &kv->key);
    if (e == FX_OK) e = get_bytes(o, "value", &kv->value);
    if (e == FX_OK) e = get_i64(o, "create_revision", &kv->create_revision);
    if (e == FX_OK) e = get_i64(o, "mod_revision", &kv->mod_revision);
    if (e == FX_OK) e = get_i64(o, "version", &kv->version);
    if (e == FX_OK) e = get_i64(o, "lease", &kv->lease);
    if (e != FX_OK) fx_kv_free(kv);
    return e;
}

/* Optional kv object member into *kv / *has. */
static fx_err get_kv(const cJSON *o, const char *name, fx_kv *kv, bool *has)
{
    const cJSON *it;
    *has = false;
    memset(kv, 0, sizeof *kv);
    fx_err e = get_obj(o, name, &it);
    if (e != FX_OK || !it) return e;
    e = parse_kv(it, kv);
    *has = (e == FX_OK);
    return e;
}

static fx_err get_kvs(const cJSON *o, const char *name, fx_kv **out, size_t *n_out)
{
    const cJSON *arr;
    *out = NULL;
    *n_out = 0;
    fx_err e = get_arr(o, name, &arr);
    if (e != FX_OK || !arr) return e;
    int n = cJSON_GetArraySize(arr);
    if (n <= 0) return FX_OK;
    fx_kv *kvs = calloc((size_t)n, sizeof *kvs);
    if (!kvs) return fx_seterr(FX_ENOMEM, "out of memory parsing an etcd response");
    size_t i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, arr) {
        e = parse_kv(it, &kvs[i]);
        if (e != FX_OK) {
            kvs_free(kvs, i);
            return e;
        }
        i++;
    }
    *out = kvs;
    *n_out = i;
    return FX_OK;
}

static fx_err range_from(const cJSON *o, fx_range_resp *out)
{
    memset(out, 0, sizeof *out);
    fx_err e = header_rev(o, &out->revision);
    if (e == FX_OK) e = get_i64(o, "count", &out->count);
    if (e == FX_OK) e = get_bool(o, "more", &out->more);
    if (e == FX_OK) e = get_kvs(o, "kvs", &out->kvs, &out->n_kvs);
    if (e != FX_OK) fx_range_resp_free(out);
    return e;
}

static fx_err put_from(const cJSON *o, fx_put_resp *out)
{
    memset(out, 0, sizeof *out);
    fx_err e = header_rev(o, &out->revision);
    if (e == FX_OK) e = get_kv(o, "prev_kv", &out->prev_kv, &out->has_prev);
    if (e != FX_OK) fx_put_resp_free(out);
    return e;
}

static fx_err del_from(const cJSON *o, fx_del_resp *out)
{
    memset(out, 0, sizeof *out);
    fx_err e = header_rev(o, &out->revision);
    if (e == FX_OK) e = get_i64(o, "deleted", &out->deleted);
    if (e == FX_OK) e = get_kvs(o, "prev_kvs", &out->prev_kvs, &out->n_prev_kvs);
    if (e != FX_OK) fx_del_resp_free(out);
    return e;
}

static fx_err op_resp_from(const cJSON *o, fx_op_resp *out)
{
    const cJSON *m;
    memset(out, 0, sizeof *out);
    if (!cJSON_IsObject(o)) return bad("responses");
    if ((m = member(o, "response_range")) != NULL) {
        out->type = FX_OP_RANGE;
        return cJSON_IsObject(m) ? range_from(m, &out->u.range) : bad("response_range");
    }
    if ((m = member(o, "response_put")) != NULL) {
        out->type = FX_OP_PUT;
        return cJSON_IsObject(m) ? put_from(m, &out->u.put) : bad("response_put");
    }
    if ((m = member(o, "response_delete_range")) != NULL) {
        out->type = FX_OP_DELETE;
        return cJSON_IsObject(m) ? del_from(m, &out->u.del) : bad("response_delete_range");
    }
    if (member(o, "response_txn"))
        return fx_seterr(FX_EPROTO, "etcd response: nested txn responses are not supported");
    return bad("responses");
}

static fx_err txn_from(const cJSON *o, fx_txn_resp *out)
{
    const cJSON *arr;
    memset(out, 0, sizeof *out);
    fx_err e = header_rev(o, &out->revision);
    if (e == FX_OK) e = get_bool(o, "succeeded", &out->succeeded);
    if (e == FX_OK) e = get_arr(o, "responses", &arr);
    if (e != FX_OK) return e;
    int n = arr ? cJSON_GetArraySize(arr) : 0;
    if (n <= 0) return FX_OK;
    out->responses = calloc((size_t)n, sizeof *out->responses);
    if (!out->responses) return fx_seterr(FX_ENOMEM, "out of memory parsing an etcd response");
    const cJSON *it;
    cJSON_ArrayForEach(it, arr) {
        e = op_resp_from(it, &out->responses[out->n_responses]);
        if (e != FX_OK) {
            fx_txn_resp_free(out);
            return e;
        }
        out->n_responses++;
    }
    return FX_OK;
}

/* Parse body and run fn on the root object. */
static fx_err parse_with(const char *body, size_t len, void *out,
                         fx_err (*fn)(const cJSON *root, void *out))
{
    cJSON *root;
    fx_err e = parse_root(body, len, &root);
    if (e != FX_OK) return e;
    e = fn(root, out);
    cJSON_Delete(root);
    return e;
}

static fx_err range_cb(const cJSON *o, void *out) { return range_from(o, out); }
static fx_err put_cb(const cJSON *o, void *out) { return put_from(o, out); }
static fx_err del_cb(const cJSON *o, void *out) { return del_from(o, out); }
static fx_err txn_cb(const cJSON *o, void *out) { return txn_from(o, out); }
static fx_err header_cb(const cJSON *o, void *out) { return header_rev(o, out); }

fx_err fx_ej_parse_range(const char *body, size_t len, fx_range_resp *out)
{
    memset(out, 0, sizeof *out);
    return parse_with(body, len, out, range_cb);
}

fx_err fx_ej_parse_put(const char *body, size_t len, fx_put_resp *out)
{
    memset(out, 0, sizeof *out);
    return parse_with(body, len, out, put_cb);
}

fx_err fx_ej_parse_del(const char *body, size_t len, fx_del_resp *out)
{
    memset(out, 0, sizeof *out);
    return parse_with(body, len, out, del_cb);
}

fx_err fx_ej_parse_txn(const char *body, size_t len, fx_txn_resp *out)
{
    memset(out, 0, sizeof *out);
    return parse_with(body, len, out, txn_cb);
}

fx_err fx_ej_parse_header(const char *body, size_t len, int64_t *rev)
{
    int64_t r = 0;
    fx_err e = parse_with(body, len, &r, header_cb);
    if (rev) *rev = (e == FX_OK) ? r : 0;
    return e;
}

struct grant_out {
    int64_t id, ttl;
};

static fx_err grant_cb(const cJSON *o, void *out)
{
    struct grant_out *g = out;
    if (!member(o, "ID")) return fx_seterr(FX_EPROTO, "etcd lease grant response without ID");
    fx_err e = get_i64(o, "ID", &g->id);
    if (e == FX_OK) e = get_i64(o, "TTL", &g->ttl);
    return e;
}

fx_err fx_ej_parse_lease_grant(const char *body, size_t len, int64_t *id, int64_t *ttl)
{
    struct grant_out g = {0, 0};
    fx_err e = parse_with(body, len, &g, grant_cb);
    if (e != FX_OK) g.id = g.ttl = 0;
    if (id) *id = g.id;
    if (ttl) *ttl = g.ttl;
    return e;
}

/* Extract code and message of an error object or a unary error body into e (see header). */
static void extract_error(const cJSON *root, fx_ej_error *e)
{
    const cJSON *err = cJSON_GetObjectItemCaseSensitive(root, "error");
    const cJSON *code = cJSON_GetObjectItemCaseSensitive(root, "code");
    const cJSON *msg = cJSON_GetObjectItemCaseSensitive(root, "message");
    if (cJSON_IsObject(err)) { /* stream error object */
        code = cJSON_GetObjectItemCaseSensitive(err, "grpc_code");
        msg = cJSON_GetObjectItemCaseSensitive(err, "message");
    } else if (!cJSON_IsString(msg) && cJSON_IsString(err)) {
        msg = err;
    }
    if (cJSON_IsNumber(code) && code->valuedouble >= 0 && code->valuedouble <= 1000)
        e->grpc_code = (int)code->valuedouble;
    if (cJSON_IsString(msg)) snprintf(e->message, sizeof e->message, "%s", msg->valuestring);
}

struct ka_out {
    int64_t ttl;
    fx_err err;
};

static fx_err keepalive_cb(const cJSON *o, void *out)
{
    struct ka_out *k = out;
    const cJSON *res;
    if (member(o, "error")) { /* {"error":{"grpc_code":..}} inside the 200 stream */
        fx_ej_error e = {200, -1, ""};
        extract_error(o, &e);
        fx_err m = fx_ej_map_error(0, e.grpc_code, e.message);
        if (m == FX_ENOTFOUND) m = FX_ELEASE_EXPIRED;
        return fx_seterr(m, "etcd keepalive stream error (code %d): %s", e.grpc_code, e.message);
    }
    fx_err e = get_obj(o, "result", &res);
    if (e != FX_OK) return e;
    if (!res) return fx_seterr(FX_EPROTO, "etcd keepalive response without result");
    e = get_i64(res, "TTL", &k->ttl);
    if (e != FX_OK) return e;
    if (k->ttl <= 0) {
        int64_t id = 0;
        (void)get_i64(res, "ID", &id);
        k->ttl = 0;
        return fx_seterr(FX_ELEASE_EXPIRED, "lease %" PRId64 " expired or unknown", id);
    }
    return FX_OK;
}

fx_err fx_ej_parse_keepalive(const char *body, size_t len, int64_t *ttl)
{
    struct ka_out k = {0, FX_OK};
    fx_err e = parse_with(body, len, &k, keepalive_cb);
    if (ttl) *ttl = (e == FX_OK) ? k.ttl : 0;
    return e;
}

static fx_err ttl_cb(const cJSON *o, void *out)
{
    struct grant_out *g = out;
    fx_err e = get_i64(o, "TTL", &g->ttl);
    if (e == FX_OK) e = get_i64(o, "grantedTTL", &g->id);
    return e;
}

fx_err fx_ej_parse_timetolive(const char *body, size_t len, int64_t *ttl, int64_t *granted)
{
    struct grant_out g = {0, 0}; /* id holds grantedTTL */
    fx_err e = parse_with(body, len, &g, ttl_cb);
    if (e != FX_OK) g.id = g.ttl = 0;
    if (ttl) *ttl = g.ttl;
    if (granted) *granted = g.id;
    return e;
}

static fx_err status_cb(const cJSON *o, void *out)
{
    fx_etcd_status *s = out;
    const cJSON *v = member(o, "version");
    if (v && !cJSON_IsString(v)) return bad("version");
    if (v) snprintf(s->version, sizeof s->version, "%s", v->valuestring);
    fx_err e = get_i64(o, "dbSize", &s->db_size);
    if (e == FX_OK) e = get_int(o, "leader", true, &s->leader);
    if (e == FX_OK) e = get_int(o, "raftIndex", true, &s->raft_index);
    if (e == FX_OK) e = header_rev(o, &s->revision);
    return e;
}

fx_err fx_ej_parse_status(const char *body, size_t len, fx_etcd_status *out)
{
    memset(out, 0, sizeof *out);
    fx_err e = parse_with(body, len, out, status_cb);
    if (e != FX_OK) memset(out, 0, sizeof *out);
    return e;
}

static fx_err auth_cb(const cJSON *o, void *out)
{
    char **token = out;
    const cJSON *t = member(o, "token");
    if (!cJSON_IsString(t) || !t->valuestring[0])
        return fx_seterr(FX_EPROTO, "etcd authenticate response without token");
    /* The token goes into an HTTP header: refuse anything that could break the header. */
    for (const char *p = t->valuestring; *p; p++)
        if ((unsigned char)*p < 0x21 || (unsigned char)*p > 0x7e)
            return fx_seterr(FX_EPROTO, "etcd authenticate response: invalid token characters");
    *token = strdup(t->valuestring);
    return *token ? FX_OK : fx_seterr(FX_ENOMEM, "out of memory parsing an etcd response");
}

fx_err fx_ej_parse_auth(const char *body, size_t len, char **token)
{
    *token = NULL;
    return parse_with(body, len, token, auth_cb);
}

/* ==== errors ===================================================================================== */

static bool has(const char *msg, const char *needle) { return strstr(msg, needle) != NULL; }

bool fx_ej_is_lease_not_found(const char *message)
{
    return message && has(message, "requested lease not found");
}

fx_err fx_ej_map_error(int http_status, int grpc_code, const char *msg)
{
    if (!msg) msg = "";
    switch (grpc_code) {
    case 1: return FX_ECANCELED;
    case 3:
        if (has(msg, "too many operations")) return FX_ETXN_TOO_MANY_OPS;
        if (has(msg, "request is too large")) return FX_ETOO_LARGE;
        if (has(msg, "duplicate key")) return FX_EDUPLICATE_KEY;
        if (has(msg, "authentication failed") || has(msg, "user name is empty")) return FX_EAUTH;
        return FX_EINVAL;
    case 4: return FX_ETIMEDOUT;
    case 5: return FX_ENOTFOUND;
    case 6: return FX_EEXISTS;
    case 7: return FX_EPERM;
    case 8: return FX_ENOSPACE;
    case 9: return FX_EEXISTS;
    case 11:
        if (has(msg, "compacted")) return FX_ECOMPACTED;
        if (has(msg, "future revision")) return FX_EFUTURE_REV;
        return FX_EINVAL;
    case 14: return FX_EUNAVAIL;
    case 16: return FX_EAUTH;
    default:
        if (grpc_code >= 0) return FX_ESERVER;
        break;
    }
    switch (http_status) {
    case 400: return FX_EINVAL;
    case 401: return FX_EAUTH;
    case 403: return FX_EPERM;
    case 404: return FX_ENOTFOUND;
    case 412: return FX_EEXISTS;
    case 413: return FX_ETOO_LARGE;
    case 429: return FX_ENOSPACE;
    case 502:
    case 503: return FX_EUNAVAIL;
    case 504: return FX_ETIMEDOUT;
    default: return FX_ESERVER;
    }
}

fx_err fx_ej_parse_error(int http_status, const char *body, size_t len, fx_ej_error *e)
{
    e->http_status = http_status;
    e->grpc_code = -1;
    e->message[0] = '\0';
    cJSON *j = (body && len && len <= FX_EJ_MAX_BODY) ? cJSON_ParseWithLength(body, len) : NULL;
    if (cJSON_IsObject(j)) extract_error(j, e);
    cJSON_Delete(j);
    if (!e->message[0] && body && len) {
        /* Not our JSON (a proxy page, "404 page not found"): keep a printable prefix. */
        size_t n = len < sizeof e->message - 1 ? len : sizeof e->message - 1, o = 0;
        for (size_t i = 0; i < n; i++) {
            unsigned char ch = (unsigned char)body[i];
            if (ch == '\n' || ch == '\r') break;
            e->message[o++] = (ch >= 0x20 && ch < 0x7f) ? (char)ch : '?';
        }
        e->message[o] = '\0';
    }
    return fx_ej_map_error(http_status, e->grpc_code, e->message);
}

int fx_ej_grpc_code_by_name(const char *name, size_t len)
{
    static const char *const names[] = {
        "OK",       "Canceled",           "Unknown",           "InvalidArgument",
        "DeadlineExceeded", "NotFound",   "AlreadyExists",     "PermissionDenied",
        "ResourceExhausted", "FailedPrecondition", "Aborted",  "OutOfRange",
        "Unimplemented", "Internal",      "Unavailable",       "DataLoss",
        "Unauthenticated"};
    for (size_t i = 0; i < NELEM(names); i++)
        if (strlen(names[i]) == len && memcmp(names[i], name, len) == 0) return (int)i;
    return -1;
}

/* ==== watch stream lines ========================================================================== */

static fx_err parse_event(const cJSON *o, fx_event *ev)
{
    memset(ev, 0, sizeof *ev);
    if (!cJSON_IsObject(o)) return bad("events");
    const cJSON *t = member(o, "type");
    if (!t || (cJSON_IsString(t) && !strcmp(t->valuestring, "PUT")) ||
        (cJSON_IsNumber(t) && t->valuedouble == 0))
        ev->type = FX_EV_PUT;
    else if ((cJSON_IsString(t) && !strcmp(t->valuestring, "DELETE")) ||
             (cJSON_IsNumber(t) && t->valuedouble == 1))
        ev->type = FX_EV_DELETE;
    else
        return bad("type");
    const cJSON *kv = member(o, "kv");
    if (!kv) return bad("kv");
    fx_err e = parse_kv(kv, &ev->kv);
    if (e == FX_OK) e = get_kv(o, "prev_kv", &ev->prev_kv, &ev->has_prev);
    if (e != FX_OK) fx_event_free(ev);
    return e;
}

/* "rpc error: code = PermissionDenied desc = etcdserver: permission denied" -> code, desc. */
static void parse_cancel_reason(const char *reason, int *code, const char **desc)
{
    *code = -1;
    *desc = reason;
    const char *c = strstr(reason, "code = ");
    if (!c) return;
    c += 7;
    size_t n = strcspn(c, " ");
    *code = fx_ej_grpc_code_by_name(c, n);
    const char *d = strstr(c, "desc = ");
    if (d) *desc = d + 7;
}

static fx_err watch_result(const cJSON *res, fx_ej_watch_line *out)
{
    bool canceled = false;
    const cJSON *evs;
    fx_err e = header_rev(res, &out->revision);
    if (e == FX_OK) e = get_i64(res, "watch_id", &out->watch_id);
    if (e == FX_OK) e = get_bool(res, "created", &out->created);
    if (e == FX_OK) e = get_bool(res, "canceled", &canceled);
    if (e == FX_OK) e = get_i64(res, "compact_revision", &out->compact_revision);
    if (e == FX_OK) e = get_arr(res, "events", &evs);
    if (e != FX_OK) return e;
    if (canceled) {
        const cJSON *r = member(res, "cancel_reason");
        if (r && !cJSON_IsString(r)) return bad("cancel_reason");
        if (r) snprintf(out->reason, sizeof out->reason, "%s", r->valuestring);
        out->kind = FX_WL_CANCELED;
        if (out->compact_revision > 0) {
            out->grpc_code = 11;
            out->err = FX_ECOMPACTED;
        } else {
            const char *desc;
            parse_cancel_reason(out->reason, &out->grpc_code, &desc);
            out->err = out->grpc_code >= 0 ? fx_ej_map_error(0, out->grpc_code, desc)
                                           : FX_ECANCELED;
        }
        return FX_OK;
    }
    if (out->created) {
        out->kind = FX_WL_CREATED;
        return FX_OK;
    }
    int n = evs ? cJSON_GetArraySize(evs) : 0;
    if (n <= 0) {
        out->kind = FX_WL_PROGRESS;
        return FX_OK;
    }
    out->kind = FX_WL_EVENTS;
    out->events = calloc((size_t)n, sizeof *out->events);
    if (!out->events) return fx_seterr(FX_ENOMEM, "out of memory parsing a watch response");
    const cJSON *it;
    cJSON_ArrayForEach(it, evs) {
        e = parse_event(it, &out->events[out->n_events]);
        if (e != FX_OK) return e;
        out->n_events++;
    }
    return FX_OK;
}

fx_err fx_ej_parse_watch_line(const char *line, size_t len, fx_ej_watch_line *out)
{
    memset(out, 0, sizeof *out);
    out->grpc_code = -1;
    while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r' || line[len - 1] == ' '))
        len--;
    cJSON *root;
    fx_err e = parse_root(line, len, &root);
    if (e != FX_OK) return e;
    const cJSON *res = member(root, "result");
    if (member(root, "error")) {
        fx_ej_error er = {0, -1, ""};
        extract_error(root, &er);
        out->kind = FX_WL_ERROR;
        out->grpc_code = er.grpc_code;
        snprintf(out->reason, sizeof out->reason, "%s", er.message);
        /* A stream that ends with an error object without code is a broken stream: UNAVAIL. */
        out->err = er.grpc_code >= 0 ? fx_ej_map_error(0, er.grpc_code, er.message) : FX_EUNAVAIL;
    } else if (cJSON_IsObject(res)) {
        e = watch_result(res, out);
    } else {
        e = fx_seterr(FX_EPROTO, "watch response without result");
    }
    cJSON_Delete(root);
    if (e != FX_OK) fx_ej_watch_line_free(out);
    return e;
}
