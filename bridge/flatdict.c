/* flatdict.c -- FlatDict codec and MQ message record (contract in flatdict.h). Pure: no I/O. */
#include "flatdict.h"

#include <stdlib.h>
#include <string.h>

/* ---- little-endian helpers (alignment-free) -------------------------------------------------- */

static void put_u32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

static uint32_t get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_u64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

/* ---- validation ------------------------------------------------------------------------------- */

/* Strict UTF-8: no overlongs, no surrogates, nothing above U+10FFFF. */
static bool utf8_ok(const uint8_t *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t need;
        uint32_t cp, min;
        if (c >= 0xc2 && c <= 0xdf) {
            need = 1;
            cp = c & 0x1fu;
            min = 0x80;
        } else if (c >= 0xe0 && c <= 0xef) {
            need = 2;
            cp = c & 0x0fu;
            min = 0x800;
        } else if (c >= 0xf0 && c <= 0xf4) {
            need = 3;
            cp = c & 0x07u;
            min = 0x10000;
        } else {
            return false;
        }
        if (n - i - 1 < need) return false;
        for (size_t j = 1; j <= need; j++) {
            uint8_t cc = s[i + j];
            if ((cc & 0xc0u) != 0x80u) return false;
            cp = cp << 6 | (cc & 0x3fu);
        }
        if (cp < min || cp > 0x10ffffu || (cp >= 0xd800u && cp <= 0xdfffu)) return false;
        i += need + 1;
    }
    return true;
}

static bool type_known(int t)
{
    return t == FX_FD_INT64 || t == FX_FD_FLOAT64 || t == FX_FD_STRING || t == FX_FD_BYTES ||
           t == FX_FD_BOOL;
}

/* Encoded value length of an entry to encode. */
static size_t val_len(const fx_fd_entry *e)
{
    switch (e->type) {
    case FX_FD_INT64:
    case FX_FD_FLOAT64: return 8;
    case FX_FD_BOOL: return 1;
    case FX_FD_STRING:
    case FX_FD_BYTES: return e->val.len;
    }
    return 0;
}

static int key_cmp(const fx_slice *a, const fx_slice *b)
{
    size_t n = a->len < b->len ? a->len : b->len;
    int c = n ? memcmp(a->data, b->data, n) : 0;
    if (c) return c;
    return (a->len > b->len) - (a->len < b->len);
}

static int ent_ptr_cmp(const void *a, const void *b)
{
    const fx_fd_entry *x = *(const fx_fd_entry *const *)a, *y = *(const fx_fd_entry *const *)b;
    return key_cmp(&x->key, &y->key);
}

/* FX_OK if no two entries share a key; else code (with detail), or FX_ENOMEM. */
static fx_err dup_check(const fx_fd_entry *e, size_t n, fx_err code)
{
    if (n <= 32) {
        for (size_t i = 1; i < n; i++)
            for (size_t j = 0; j < i; j++)
                if (key_cmp(&e[i].key, &e[j].key) == 0)
                    return fx_seterr(code, "flatdict: duplicate key at entry %zu", i);
        return FX_OK;
    }
    const fx_fd_entry **p = malloc(n * sizeof *p);
    if (!p) return fx_seterr(FX_ENOMEM, "flatdict: out of memory");
    for (size_t i = 0; i < n; i++) p[i] = &e[i];
    qsort(p, n, sizeof *p, ent_ptr_cmp);
    fx_err r = FX_OK;
    for (size_t i = 1; i < n && !r; i++)
        if (key_cmp(&p[i]->key, &p[i - 1]->key) == 0)
            r = fx_seterr(code, "flatdict: duplicate key at entry %zu", (size_t)(p[i] - e));
    free(p);
    return r;
}

/* ---- encoding ---------------------------------------------------------------------------------- */

fx_err fx_fd_encoded_size(const fx_fd_entry *e, size_t n, size_t *out)
{
    if (out) *out = 0;
    if (!out || (n && !e)) return fx_seterr(FX_EINVAL, "flatdict: NULL argument");
    if (n > UINT32_MAX) return fx_seterr(FX_ETOO_LARGE, "flatdict: too many entries");
    uint64_t total = FX_FD_HEADER_SIZE;
    for (size_t i = 0; i < n; i++) {
        const fx_fd_entry *x = &e[i];
        if (x->key.len == 0 || x->key.len > FX_FD_KEY_MAX || !x->key.data)
            return fx_seterr(FX_EINVAL, "flatdict: entry %zu: key must be 1..%d bytes", i,
                             FX_FD_KEY_MAX);
        if (!utf8_ok(x->key.data, x->key.len))
            return fx_seterr(FX_EINVAL, "flatdict: entry %zu: key is not valid UTF-8", i);
        if (!type_known((int)x->type))
            return fx_seterr(FX_EINVAL, "flatdict: entry %zu: unknown type %d", i, (int)x->type);
        if ((x->type == FX_FD_STRING || x->type == FX_FD_BYTES) && x->val.len && !x->val.data)
            return fx_seterr(FX_EINVAL, "flatdict: entry %zu: NULL value data", i);
        size_t vl = val_len(x);
        if (vl > UINT32_MAX)
            return fx_seterr(FX_ETOO_LARGE, "flatdict: entry %zu: value over 4 GiB", i);
        total += FX_FD_ENTRY_OVERHEAD + (uint64_t)x->key.len + (uint64_t)vl;
        if (total > UINT32_MAX)
            return fx_seterr(FX_ETOO_LARGE, "flatdict: encoding over 4 GiB");
    }
    fx_err r = dup_check(e, n, FX_EINVAL);
    if (r) return r;
    if (total > SIZE_MAX) return fx_seterr(FX_ETOO_LARGE, "flatdict: encoding too large");
    *out = (size_t)total;
    return FX_OK;
}

fx_err fx_fd_encode_into(const fx_fd_entry *e, size_t n, uint8_t *buf, size_t cap,
                         size_t *out_len)
{
    if (out_len) *out_len = 0;
    if (!out_len || (cap && !buf)) return fx_seterr(FX_EINVAL, "flatdict: NULL argument");
    size_t need;
    fx_err r = fx_fd_encoded_size(e, n, &need);
    if (r) return r;
    if (need > cap)
        return fx_seterr(FX_ETOO_LARGE, "flatdict: needs %zu bytes, buffer has %zu", need, cap);
    size_t o = 0;
    put_u32(buf, (uint32_t)n);
    o += 4;
    for (size_t i = 0; i < n; i++) {
        const fx_fd_entry *x = &e[i];
        size_t vl = val_len(x);
        put_u32(buf + o, (uint32_t)x->key.len);
        o += 4;
        memcpy(buf + o, x->key.data, x->key.len);
        o += x->key.len;
        buf[o++] = (uint8_t)x->type;
        put_u32(buf + o, (uint32_t)vl);
        o += 4;
        switch (x->type) {
        case FX_FD_INT64: put_u64(buf + o, (uint64_t)x->i64); break;
        case FX_FD_FLOAT64: {
            uint64_t bits;
            memcpy(&bits, &x->f64, 8);
            put_u64(buf + o, bits);
            break;
        }
        case FX_FD_BOOL: buf[o] = x->b ? 1 : 0; break;
        case FX_FD_STRING:
        case FX_FD_BYTES:
            if (vl) memcpy(buf + o, x->val.data, vl);
            break;
        }
        o += vl;
    }
    *out_len = o;
    return FX_OK;
}

fx_err fx_fd_encode(const fx_fd_entry *e, size_t n, fx_bytes *out)
{
    if (!out) return fx_seterr(FX_EINVAL, "flatdict: NULL output");
    out->data = NULL;
    out->len = 0;
    size_t need;
    fx_err r = fx_fd_encoded_size(e, n, &need);
    if (r) return r;
    uint8_t *b = malloc(need + 1);
    if (!b) return fx_seterr(FX_ENOMEM, "flatdict: out of memory (%zu bytes)", need);
    size_t len;
    r = fx_fd_encode_into(e, n, b, need, &len);
    if (r) {
        free(b);
        return r;
    }
    b[len] = 0;
    out->data = b;
    out->len = len;
    return FX_OK;
}

/* ---- decoding ---------------------------------------------------------------------------------- */

#define TRUNC(what) fx_seterr(FX_EPROTO, "flatdict: truncated in entry %zu (%s) at byte %zu", i, what, pos)

fx_err fx_fd_decode(const void *buf, size_t len, size_t max_entries, size_t max_size,
                    fx_fd_entry *out, size_t *out_n)
{
    if (out_n) *out_n = 0;
    if (!out_n || (!buf && len)) return fx_seterr(FX_EINVAL, "flatdict: NULL argument");
    const uint8_t *p = buf;
    if (len > max_size)
        return fx_seterr(FX_EPROTO, "flatdict: %zu bytes, more than the limit %zu", len, max_size);
    if (len < FX_FD_HEADER_SIZE)
        return fx_seterr(FX_EPROTO, "flatdict: %zu bytes, shorter than the header", len);
    uint32_t count = get_u32(p);
    if (count > max_entries)
        return fx_seterr(FX_EPROTO, "flatdict: %u entries, more than the limit %zu", count,
                         max_entries);
    /* Each entry takes at least overhead + a 1-byte key. */
    if (count > (len - FX_FD_HEADER_SIZE) / (FX_FD_ENTRY_OVERHEAD + 1))
        return fx_seterr(FX_EPROTO, "flatdict: %u entries cannot fit in %zu bytes", count, len);
    if (count && !out) return fx_seterr(FX_EINVAL, "flatdict: NULL output");
    size_t pos = FX_FD_HEADER_SIZE;
    for (size_t i = 0; i < count; i++) {
        fx_fd_entry *x = &out[i];
        memset(x, 0, sizeof *x);
        if (len - pos < 4) return TRUNC("key length");
        uint32_t kl = get_u32(p + pos);
        pos += 4;
        if (kl == 0) return fx_seterr(FX_EPROTO, "flatdict: entry %zu: empty key", i);
        if (kl > FX_FD_KEY_MAX)
            return fx_seterr(FX_EPROTO, "flatdict: entry %zu: key of %u bytes, more than %d", i,
                             kl, FX_FD_KEY_MAX);
        if (len - pos < kl) return TRUNC("key");
        x->key = (fx_slice){p + pos, kl};
        if (!utf8_ok(p + pos, kl))
            return fx_seterr(FX_EPROTO, "flatdict: entry %zu: key is not valid UTF-8", i);
        pos += kl;
        if (len - pos < 5) return TRUNC("type and value length");
        uint8_t t = p[pos];
        uint32_t vl = get_u32(p + pos + 1);
        pos += 5;
        if (!type_known(t)) return fx_seterr(FX_EPROTO, "flatdict: entry %zu: unknown type %u", i, t);
        if (len - pos < vl) return TRUNC("value");
        const uint8_t *v = p + pos;
        x->type = (fx_fd_type)t;
        x->val = (fx_slice){v, vl};
        switch (x->type) {
        case FX_FD_INT64:
        case FX_FD_FLOAT64:
            if (vl != 8)
                return fx_seterr(FX_EPROTO, "flatdict: entry %zu: type %u needs 8 bytes, has %u", i,
                                 t, vl);
            if (x->type == FX_FD_INT64) {
                x->i64 = (int64_t)get_u64(v);
            } else {
                uint64_t bits = get_u64(v);
                memcpy(&x->f64, &bits, 8);
            }
            break;
        case FX_FD_BOOL:
            if (vl != 1 || v[0] > 1)
                return fx_seterr(FX_EPROTO, "flatdict: entry %zu: bool must be one byte 0 or 1", i);
            x->b = v[0] == 1;
            break;
        case FX_FD_STRING:
        case FX_FD_BYTES: break;
        }
        pos += vl;
    }
    if (pos != len)
        return fx_seterr(FX_EPROTO, "flatdict: %zu trailing bytes after %u entries", len - pos,
                         count);
    fx_err r = dup_check(out, count, FX_EPROTO);
    if (r) return r;
    *out_n = count;
    return FX_OK;
}

const fx_fd_entry *fx_fd_find(const fx_fd_entry *e, size_t n, const char *key)
{
    if (!e || !key) return NULL;
    fx_slice k = FX_SLICE_STR(key);
    for (size_t i = 0; i < n; i++)
        if (key_cmp(&e[i].key, &k) == 0) return &e[i];
    return NULL;
}

/* ---- MQ message record ----------------------------------------------------------------------- */

static fx_err msg_entries(const fx_mq_msg *m, fx_fd_entry ents[4])
{
    if (!m) return fx_seterr(FX_EINVAL, "mq message: NULL argument");
    if (m->subject.len == 0 || !m->subject.data)
        return fx_seterr(FX_EINVAL, "mq message: empty subject");
    if (m->publish_ns < 0) return fx_seterr(FX_EINVAL, "mq message: negative publish_ns");
    ents[0] = fx_fd_string(FX_MQ_MSG_KEY_SUBJECT, m->subject);
    ents[1] = fx_fd_bytes(FX_MQ_MSG_KEY_HEADERS, m->headers);
    ents[2] = fx_fd_int64(FX_MQ_MSG_KEY_PUBLISH_NS, m->publish_ns);
    ents[3] = fx_fd_bytes(FX_MQ_MSG_KEY_DATA, m->data);
    return FX_OK;
}

fx_err fx_mq_msg_encoded_size(const fx_mq_msg *m, size_t *out)
{
    fx_fd_entry ents[4];
    if (out) *out = 0;
    fx_err r = msg_entries(m, ents);
    return r ? r : fx_fd_encoded_size(ents, 4, out);
}

fx_err fx_mq_msg_encode_into(const fx_mq_msg *m, uint8_t *buf, size_t cap, size_t *out_len)
{
    fx_fd_entry ents[4];
    if (out_len) *out_len = 0;
    fx_err r = msg_entries(m, ents);
    return r ? r : fx_fd_encode_into(ents, 4, buf, cap, out_len);
}

fx_err fx_mq_msg_encode(const fx_mq_msg *m, fx_bytes *out)
{
    fx_fd_entry ents[4];
    if (out) {
        out->data = NULL;
        out->len = 0;
    }
    fx_err r = msg_entries(m, ents);
    return r ? r : fx_fd_encode(ents, 4, out);
}

fx_err fx_mq_msg_decode(const void *buf, size_t len, size_t max_size, fx_mq_msg *out)
{
    if (!out) return fx_seterr(FX_EINVAL, "mq message: NULL output");
    fx_fd_entry ents[FX_MQ_MSG_MAX_ENTRIES];
    size_t n = 0;
    fx_err r = fx_fd_decode(buf, len, FX_MQ_MSG_MAX_ENTRIES, max_size, ents, &n);
    if (r) return r;
    const fx_fd_entry *s = fx_fd_find(ents, n, FX_MQ_MSG_KEY_SUBJECT);
    const fx_fd_entry *h = fx_fd_find(ents, n, FX_MQ_MSG_KEY_HEADERS);
    const fx_fd_entry *t = fx_fd_find(ents, n, FX_MQ_MSG_KEY_PUBLISH_NS);
    const fx_fd_entry *d = fx_fd_find(ents, n, FX_MQ_MSG_KEY_DATA);
    if (!s || s->type != FX_FD_STRING || s->val.len == 0)
        return fx_seterr(FX_EPROTO, "mq message: '%s' missing, empty or not a string",
                         FX_MQ_MSG_KEY_SUBJECT);
    if (h && h->type != FX_FD_BYTES)
        return fx_seterr(FX_EPROTO, "mq message: '%s' is not bytes", FX_MQ_MSG_KEY_HEADERS);
    if (!t || t->type != FX_FD_INT64 || t->i64 < 0)
        return fx_seterr(FX_EPROTO, "mq message: '%s' missing, not int64 or negative",
                         FX_MQ_MSG_KEY_PUBLISH_NS);
    if (!d || d->type != FX_FD_BYTES)
        return fx_seterr(FX_EPROTO, "mq message: '%s' missing or not bytes", FX_MQ_MSG_KEY_DATA);
    out->subject = s->val;
    out->headers = h ? h->val : (fx_slice){NULL, 0};
    out->publish_ns = t->i64;
    out->data = d->val;
    return FX_OK;
}
