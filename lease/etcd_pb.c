/* etcd_pb.c -- etcd v3 KV messages in protobuf (contract: etcd_pb.h). */
#include "etcd_pb.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* ==== encoding ===================================================================================== */

enum { WT_VARINT = 0, WT_I64 = 1, WT_LEN = 2, WT_I32 = 5 };

static size_t vlen(uint64_t v)
{
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

static size_t tlen(unsigned field) { return vlen((uint64_t)field << 3); }

static uint8_t *put_v(uint8_t *p, uint64_t v)
{
    while (v >= 0x80) {
        *p++ = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    *p++ = (uint8_t)v;
    return p;
}

static uint8_t *put_tag(uint8_t *p, unsigned field, unsigned wt)
{
    return put_v(p, ((uint64_t)field << 3) | wt);
}

/* Sizes of optional fields (0 when at their default and omitted). */
static size_t sz_bytes(unsigned f, fx_slice s) { return s.len ? tlen(f) + vlen(s.len) + s.len : 0; }
static size_t sz_i64(unsigned f, int64_t v) { return v ? tlen(f) + vlen((uint64_t)v) : 0; }
static size_t sz_bool(unsigned f, bool b) { return b ? tlen(f) + 1 : 0; }
static size_t sz_msg(unsigned f, size_t m) { return tlen(f) + vlen(m) + m; } /* always written */

static uint8_t *w_bytes(uint8_t *p, unsigned f, fx_slice s)
{
    if (!s.len) return p;
    p = put_tag(p, f, WT_LEN);
    p = put_v(p, s.len);
    memcpy(p, s.data, s.len);
    return p + s.len;
}

static uint8_t *w_i64(uint8_t *p, unsigned f, int64_t v)
{
    if (!v) return p;
    return put_v(put_tag(p, f, WT_VARINT), (uint64_t)v);
}

static uint8_t *w_bool(uint8_t *p, unsigned f, bool b)
{
    if (!b) return p;
    p = put_tag(p, f, WT_VARINT);
    *p++ = 1;
    return p;
}

static uint8_t *w_msg_head(uint8_t *p, unsigned f, size_t m) { return put_v(put_tag(p, f, WT_LEN), m); }

/* RangeRequest. Ascending by key is etcd's natural order: sent as no sort (fx_range_req). */
static bool key_ascend(const fx_range_req *r)
{
    return r->sort_order == FX_SORT_ASCEND && r->sort_target == FX_SORT_KEY;
}

static size_t sz_range(const fx_range_req *r)
{
    bool ka = key_ascend(r);
    return sz_bytes(1, r->key) + sz_bytes(2, r->range_end) + sz_i64(3, r->limit) +
           sz_i64(4, r->revision) + (ka ? 0 : sz_i64(5, r->sort_order) + sz_i64(6, r->sort_target)) +
           sz_bool(7, r->serializable) + sz_bool(8, r->keys_only) + sz_bool(9, r->count_only);
}

static uint8_t *w_range(uint8_t *p, const fx_range_req *r)
{
    p = w_bytes(p, 1, r->key);
    p = w_bytes(p, 2, r->range_end);
    p = w_i64(p, 3, r->limit);
    p = w_i64(p, 4, r->revision);
    if (!key_ascend(r)) {
        p = w_i64(p, 5, r->sort_order);
        p = w_i64(p, 6, r->sort_target);
    }
    p = w_bool(p, 7, r->serializable);
    p = w_bool(p, 8, r->keys_only);
    return w_bool(p, 9, r->count_only);
}

/* PutRequest */
static size_t sz_put(const fx_put_req *r)
{
    return sz_bytes(1, r->key) + sz_bytes(2, r->value) + sz_i64(3, r->lease) +
           sz_bool(4, r->prev_kv) + sz_bool(5, r->ignore_value) + sz_bool(6, r->ignore_lease);
}

static uint8_t *w_put(uint8_t *p, const fx_put_req *r)
{
    p = w_bytes(p, 1, r->key);
    p = w_bytes(p, 2, r->value);
    p = w_i64(p, 3, r->lease);
    p = w_bool(p, 4, r->prev_kv);
    p = w_bool(p, 5, r->ignore_value);
    return w_bool(p, 6, r->ignore_lease);
}

/* DeleteRangeRequest */
static size_t sz_del(const fx_del_req *r)
{
    return sz_bytes(1, r->key) + sz_bytes(2, r->range_end) + sz_bool(3, r->prev_kv);
}

static uint8_t *w_del(uint8_t *p, const fx_del_req *r)
{
    p = w_bytes(p, 1, r->key);
    p = w_bytes(p, 2, r->range_end);
    return w_bool(p, 3, r->prev_kv);
}

/* Compare: the target value (fields 4-8 of the oneof) is always written. */
static unsigned cmp_value_field(const fx_cmp *c) { return 4u + (unsigned)c->target; }

static size_t sz_cmp(const fx_cmp *c)
{
    size_t n = sz_i64(1, c->result) + sz_i64(2, c->target) + sz_bytes(3, c->key) +
               sz_bytes(64, c->range_end);
    unsigned f = cmp_value_field(c);
    if (c->target == FX_CMP_VALUE) n += tlen(f) + vlen(c->value.len) + c->value.len;
    else n += tlen(f) + vlen((uint64_t)c->num);
    return n;
}

static uint8_t *w_cmp(uint8_t *p, const fx_cmp *c)
{
    p = w_i64(p, 1, c->result);
    p = w_i64(p, 2, c->target);
    p = w_bytes(p, 3, c->key);
    unsigned f = cmp_value_field(c);
    if (c->target == FX_CMP_VALUE) {
        p = put_v(put_tag(p, f, WT_LEN), c->value.len);
        if (c->value.len) memcpy(p, c->value.data, c->value.len);
        p += c->value.len;
    } else {
        p = put_v(put_tag(p, f, WT_VARINT), (uint64_t)c->num);
    }
    return w_bytes(p, 64, c->range_end);
}

static size_t sz_op_inner(const fx_op *o)
{
    switch (o->type) {
    case FX_OP_RANGE: return sz_msg(1, sz_range(&o->u.range));
    case FX_OP_PUT: return sz_msg(2, sz_put(&o->u.put));
    default: return sz_msg(3, sz_del(&o->u.del));
    }
}

static uint8_t *w_op(uint8_t *p, unsigned f, const fx_op *o)
{
    p = w_msg_head(p, f, sz_op_inner(o));
    switch (o->type) {
    case FX_OP_RANGE: return w_range(w_msg_head(p, 1, sz_range(&o->u.range)), &o->u.range);
    case FX_OP_PUT: return w_put(w_msg_head(p, 2, sz_put(&o->u.put)), &o->u.put);
    default: return w_del(w_msg_head(p, 3, sz_del(&o->u.del)), &o->u.del);
    }
}

static bool cmp_ok(const fx_cmp *c)
{
    return c->target >= FX_CMP_VERSION && c->target <= FX_CMP_LEASE &&
           c->result >= FX_CMP_EQUAL && c->result <= FX_CMP_NOT_EQUAL;
}

static bool range_ok(const fx_range_req *r)
{
    return r->sort_order >= FX_SORT_NONE && r->sort_order <= FX_SORT_DESCEND &&
           r->sort_target >= FX_SORT_KEY && r->sort_target <= FX_SORT_VALUE;
}

static bool op_ok(const fx_op *o)
{
    return (o->type == FX_OP_RANGE && range_ok(&o->u.range)) || o->type == FX_OP_PUT ||
           o->type == FX_OP_DELETE;
}

/* A frame of `m` message bytes: the buffer and the position of the message. */
static fx_err frame_alloc(size_t m, uint8_t **out, size_t *out_len, uint8_t **msg)
{
    if (m > UINT32_MAX - 5) return fx_seterr(FX_ETOO_LARGE, "etcd request over 4 GiB");
    uint8_t *b = malloc(5 + m);
    if (!b) return fx_seterr(FX_ENOMEM, "out of memory encoding an etcd request");
    b[0] = 0; /* not compressed */
    b[1] = (uint8_t)(m >> 24);
    b[2] = (uint8_t)(m >> 16);
    b[3] = (uint8_t)(m >> 8);
    b[4] = (uint8_t)m;
    *out = b;
    *out_len = 5 + m;
    *msg = b + 5;
    return FX_OK;
}

fx_err fx_pb_range_req(const fx_range_req *r, uint8_t **out, size_t *out_len)
{
    *out = NULL;
    *out_len = 0;
    if (!range_ok(r)) return fx_seterr(FX_EINVAL, "range: bad sort order/target");
    uint8_t *p;
    fx_err e = frame_alloc(sz_range(r), out, out_len, &p);
    if (e == FX_OK) w_range(p, r);
    return e;
}

fx_err fx_pb_put_req(const fx_put_req *r, uint8_t **out, size_t *out_len)
{
    uint8_t *p;
    fx_err e = frame_alloc(sz_put(r), out, out_len, &p);
    if (e == FX_OK) w_put(p, r);
    return e;
}

fx_err fx_pb_del_req(const fx_del_req *r, uint8_t **out, size_t *out_len)
{
    uint8_t *p;
    fx_err e = frame_alloc(sz_del(r), out, out_len, &p);
    if (e == FX_OK) w_del(p, r);
    return e;
}

fx_err fx_pb_txn_req(const fx_txn_req *r, uint8_t **out, size_t *out_len)
{
    *out = NULL;
    *out_len = 0;
    size_t m = 0;
    for (size_t i = 0; i < r->n_cmp; i++) {
        if (!cmp_ok(&r->cmp[i])) return fx_seterr(FX_EINVAL, "etcd txn: invalid compare %zu", i);
        m += sz_msg(1, sz_cmp(&r->cmp[i]));
    }
    for (size_t i = 0; i < r->n_success; i++) {
        if (!op_ok(&r->success[i])) return fx_seterr(FX_EINVAL, "etcd txn: invalid op %zu", i);
        m += sz_msg(2, sz_op_inner(&r->success[i]));
    }
    for (size_t i = 0; i < r->n_failure; i++) {
        if (!op_ok(&r->failure[i])) return fx_seterr(FX_EINVAL, "etcd txn: invalid op %zu", i);
        m += sz_msg(3, sz_op_inner(&r->failure[i]));
    }
    uint8_t *p;
    fx_err e = frame_alloc(m, out, out_len, &p);
    if (e != FX_OK) return e;
    for (size_t i = 0; i < r->n_cmp; i++)
        p = w_cmp(w_msg_head(p, 1, sz_cmp(&r->cmp[i])), &r->cmp[i]);
    for (size_t i = 0; i < r->n_success; i++) p = w_op(p, 2, &r->success[i]);
    for (size_t i = 0; i < r->n_failure; i++) p = w_op(p, 3, &r->failure[i]);
    return FX_OK;
}

/* ==== decoding ===================================================================================== */

typedef struct rd {
    const uint8_t *p, *end;
} rd;

typedef struct fld {
    unsigned num, wt;
    uint64_t v;    /* WT_VARINT */
    rd sub;        /* WT_LEN */
} fld;

static fx_err bad(const char *what)
{
    return fx_seterr(FX_EPROTO, "malformed etcd gRPC response: %s", what);
}

static bool rd_v(rd *r, uint64_t *out)
{
    uint64_t v = 0;
    for (unsigned shift = 0; shift < 70; shift += 7) {
        if (r->p >= r->end) return false;
        uint8_t b = *r->p++;
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *out = v;
            return true;
        }
    }
    return false; /* over 10 bytes */
}

/* The next field; false at the end (*e set on malformed input). */
static bool rd_next(rd *r, fld *f, fx_err *e)
{
    *e = FX_OK;
    if (r->p >= r->end) return false;
    uint64_t tag, n;
    if (!rd_v(r, &tag) || (tag >> 3) == 0 || (tag >> 3) > 0x1fffffff) {
        *e = bad("field tag");
        return false;
    }
    f->num = (unsigned)(tag >> 3);
    f->wt = (unsigned)(tag & 7);
    switch (f->wt) {
    case WT_VARINT:
        if (rd_v(r, &f->v)) return true;
        break;
    case WT_I64:
    case WT_I32: {
        size_t k = f->wt == WT_I64 ? 8 : 4;
        if ((size_t)(r->end - r->p) >= k) {
            r->p += k;
            f->v = 0;
            return true;
        }
        break;
    }
    case WT_LEN:
        if (rd_v(r, &n) && n <= (uint64_t)(r->end - r->p)) {
            f->sub.p = r->p;
            f->sub.end = r->p + n;
            r->p += n;
            return true;
        }
        break;
    default: break;
    }
    *e = bad("field value");
    return false;
}

static fx_err want(const fld *f, unsigned wt, const char *name)
{
    return f->wt == wt ? FX_OK : bad(name);
}

static fx_err dup_bytes(const rd *s, fx_bytes *out)
{
    size_t n = (size_t)(s->end - s->p);
    uint8_t *b = malloc(n + 1);
    if (!b) return fx_seterr(FX_ENOMEM, "out of memory parsing an etcd response");
    if (n) memcpy(b, s->p, n);
    b[n] = '\0';
    free(out->data); /* a repeated field: the last one wins */
    out->data = b;
    out->len = n;
    return FX_OK;
}

static fx_err empty_if_missing(fx_bytes *b)
{
    if (b->data) return FX_OK;
    rd none = {NULL, NULL};
    return dup_bytes(&none, b);
}

static fx_err header_rev(rd r, int64_t *rev)
{
    fld f;
    fx_err e;
    while (rd_next(&r, &f, &e))
        if (f.num == 3) {
            if ((e = want(&f, WT_VARINT, "header.revision")) != FX_OK) return e;
            *rev = (int64_t)f.v;
        }
    return e;
}

static fx_err parse_kv(rd r, fx_kv *kv)
{
    memset(kv, 0, sizeof *kv);
    fld f;
    fx_err e = FX_OK;
    while (e == FX_OK && rd_next(&r, &f, &e)) {
        switch (f.num) {
        case 1:
            if ((e = want(&f, WT_LEN, "kv.key")) == FX_OK) e = dup_bytes(&f.sub, &kv->key);
            break;
        case 5:
            if ((e = want(&f, WT_LEN, "kv.value")) == FX_OK) e = dup_bytes(&f.sub, &kv->value);
            break;
        case 2: case 3: case 4: case 6: {
            if ((e = want(&f, WT_VARINT, "kv revision")) != FX_OK) break;
            int64_t *dst = f.num == 2 ? &kv->create_revision
                         : f.num == 3 ? &kv->mod_revision
                         : f.num == 4 ? &kv->version : &kv->lease;
            *dst = (int64_t)f.v;
            break;
        }
        default: break;
        }
    }
    if (e == FX_OK) e = empty_if_missing(&kv->key);
    if (e == FX_OK) e = empty_if_missing(&kv->value);
    if (e != FX_OK) fx_kv_free(kv);
    return e;
}

/* Room for one more element in a repeated field's array (*arr of *cap, n used): capacity
 * doubling from 4. Nothing changes on failure. */
static fx_err grow(void **arr, size_t elem, size_t n, size_t *cap)
{
    if (n < *cap) return FX_OK;
    size_t nc = *cap ? *cap * 2 : 4;
    void *a = realloc(*arr, nc * elem);
    if (!a) return fx_seterr(FX_ENOMEM, "out of memory parsing an etcd response");
    *arr = a;
    *cap = nc;
    return FX_OK;
}

/* Append one kv parsed from s to *kvs. */
static fx_err push_kv(const rd *s, fx_kv **kvs, size_t *n, size_t *cap)
{
    fx_err e = grow((void **)kvs, sizeof **kvs, *n, cap);
    if (e == FX_OK) e = parse_kv(*s, &(*kvs)[*n]);
    if (e == FX_OK) (*n)++;
    return e;
}

static fx_err range_from(rd r, fx_range_resp *out)
{
    memset(out, 0, sizeof *out);
    size_t cap = 0;
    fld f;
    fx_err e = FX_OK;
    while (e == FX_OK && rd_next(&r, &f, &e)) {
        switch (f.num) {
        case 1:
            if ((e = want(&f, WT_LEN, "range.header")) == FX_OK) e = header_rev(f.sub, &out->revision);
            break;
        case 2:
            if ((e = want(&f, WT_LEN, "range.kvs")) == FX_OK)
                e = push_kv(&f.sub, &out->kvs, &out->n_kvs, &cap);
            break;
        case 3:
            if ((e = want(&f, WT_VARINT, "range.more")) == FX_OK) out->more = f.v != 0;
            break;
        case 4:
            if ((e = want(&f, WT_VARINT, "range.count")) == FX_OK) out->count = (int64_t)f.v;
            break;
        default: break;
        }
    }
    if (e != FX_OK) fx_range_resp_free(out);
    return e;
}

static fx_err put_from(rd r, fx_put_resp *out)
{
    memset(out, 0, sizeof *out);
    fld f;
    fx_err e = FX_OK;
    while (e == FX_OK && rd_next(&r, &f, &e)) {
        if (f.num == 1) {
            if ((e = want(&f, WT_LEN, "put.header")) == FX_OK) e = header_rev(f.sub, &out->revision);
        } else if (f.num == 2) {
            if ((e = want(&f, WT_LEN, "put.prev_kv")) != FX_OK) break;
            if (out->has_prev) fx_kv_free(&out->prev_kv);
            e = parse_kv(f.sub, &out->prev_kv);
            out->has_prev = e == FX_OK;
        }
    }
    if (e != FX_OK) fx_put_resp_free(out);
    return e;
}

static fx_err del_from(rd r, fx_del_resp *out)
{
    memset(out, 0, sizeof *out);
    size_t cap = 0;
    fld f;
    fx_err e = FX_OK;
    while (e == FX_OK && rd_next(&r, &f, &e)) {
        switch (f.num) {
        case 1:
            if ((e = want(&f, WT_LEN, "delete.header")) == FX_OK) e = header_rev(f.sub, &out->revision);
            break;
        case 2:
            if ((e = want(&f, WT_VARINT, "delete.deleted")) == FX_OK) out->deleted = (int64_t)f.v;
            break;
        case 3:
            if ((e = want(&f, WT_LEN, "delete.prev_kvs")) == FX_OK)
                e = push_kv(&f.sub, &out->prev_kvs, &out->n_prev_kvs, &cap);
            break;
        default: break;
        }
    }
    if (e != FX_OK) fx_del_resp_free(out);
    return e;
}

static void op_resp_free(fx_op_resp *o)
{
    switch (o->type) {
    case FX_OP_RANGE: fx_range_resp_free(&o->u.range); break;
    case FX_OP_PUT: fx_put_resp_free(&o->u.put); break;
    default: fx_del_resp_free(&o->u.del); break;
    }
    memset(o, 0, sizeof *o);
}

static fx_err op_resp_from(rd r, fx_op_resp *out)
{
    memset(out, 0, sizeof *out);
    fld f;
    fx_err e = FX_OK;
    bool seen = false;
    while (e == FX_OK && rd_next(&r, &f, &e)) {
        if (f.num < 1 || f.num > 4) continue;
        if ((e = want(&f, WT_LEN, "txn response op")) != FX_OK) break;
        if (seen) {
            op_resp_free(out);
            return bad("txn response op with two responses");
        }
        seen = true;
        switch (f.num) {
        case 1: out->type = FX_OP_RANGE; e = range_from(f.sub, &out->u.range); break;
        case 2: out->type = FX_OP_PUT; e = put_from(f.sub, &out->u.put); break;
        case 3: out->type = FX_OP_DELETE; e = del_from(f.sub, &out->u.del); break;
        default:
            return fx_seterr(FX_EPROTO, "etcd response: nested txn responses are not supported");
        }
    }
    if (e == FX_OK && !seen) e = bad("txn response op without a response");
    if (e != FX_OK) op_resp_free(out); /* a response parsed before a malformed field */
    return e;
}

static fx_err txn_from(rd r, fx_txn_resp *out)
{
    memset(out, 0, sizeof *out);
    size_t cap = 0;
    fld f;
    fx_err e = FX_OK;
    while (e == FX_OK && rd_next(&r, &f, &e)) {
        switch (f.num) {
        case 1:
            if ((e = want(&f, WT_LEN, "txn.header")) == FX_OK) e = header_rev(f.sub, &out->revision);
            break;
        case 2:
            if ((e = want(&f, WT_VARINT, "txn.succeeded")) == FX_OK) out->succeeded = f.v != 0;
            break;
        case 3:
            if ((e = want(&f, WT_LEN, "txn.responses")) != FX_OK ||
                (e = grow((void **)&out->responses, sizeof *out->responses, out->n_responses,
                          &cap)) != FX_OK)
                break;
            e = op_resp_from(f.sub, &out->responses[out->n_responses]);
            if (e == FX_OK) out->n_responses++;
            break;
        default: break;
        }
    }
    if (e != FX_OK) fx_txn_resp_free(out);
    return e;
}

fx_err fx_pb_frame(const uint8_t *body, size_t len, const uint8_t **msg, size_t *msg_len)
{
    *msg = NULL;
    *msg_len = 0;
    if (len < 5) return bad("no message frame");
    if (body[0] != 0) return bad("compressed message");
    size_t m = ((size_t)body[1] << 24) | ((size_t)body[2] << 16) | ((size_t)body[3] << 8) | body[4];
    if (m != len - 5) return bad(m > len - 5 ? "truncated message" : "more than one message");
    *msg = body + 5;
    *msg_len = m;
    return FX_OK;
}

fx_err fx_pb_parse_range(const uint8_t *b, size_t n, fx_range_resp *out)
{
    return range_from((rd){b, b + n}, out);
}

fx_err fx_pb_parse_put(const uint8_t *b, size_t n, fx_put_resp *out)
{
    return put_from((rd){b, b + n}, out);
}

fx_err fx_pb_parse_del(const uint8_t *b, size_t n, fx_del_resp *out)
{
    return del_from((rd){b, b + n}, out);
}

fx_err fx_pb_parse_txn(const uint8_t *b, size_t n, fx_txn_resp *out)
{
    return txn_from((rd){b, b + n}, out);
}
