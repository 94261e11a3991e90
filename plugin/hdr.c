/* hdr.c -- the stored NATS header block codec. Contract: hdr.h. */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "hdr.h"

#define HDR_LINE0 "NATS/1.0\r\n"

void dm_hdr_iter_init(hdr_iter *it, const char *b, size_t len)
{
    it->end = b + len;
    it->p = len >= sizeof HDR_LINE0 - 1 ? memmem(b, len, "\r\n", 2) : NULL;
}

bool dm_hdr_iter_next(hdr_iter *it, fx_slice *key, fx_slice *val)
{
    while (it->p) {
        const char *p = it->p + 2;
        const char *eol = memmem(p, (size_t)(it->end - p), "\r\n", 2);
        if (!eol || eol == p) break; /* the empty line ends the block */
        it->p = eol;
        const char *colon = memchr(p, ':', (size_t)(eol - p));
        if (!colon || colon == p) continue;
        const char *v = colon + 1;
        while (v < eol && (*v == ' ' || *v == '\t')) v++;
        *key = (fx_slice){p, (size_t)(colon - p)};
        *val = (fx_slice){v, (size_t)(eol - v)};
        return true;
    }
    it->p = NULL;
    return false;
}

/* "key: value\r\n" at o; returns the end. */
static char *put_line(char *o, fx_slice key, fx_slice val)
{
    memcpy(o, key.data, key.len);
    o += key.len;
    *o++ = ':';
    *o++ = ' ';
    memcpy(o, val.data, val.len);
    o += val.len;
    *o++ = '\r';
    *o++ = '\n';
    return o;
}

fx_err dm_hdr_from_msg(natsMsg *m, char **out, size_t *out_len)
{
    *out = NULL;
    *out_len = 0;
    const char **keys = NULL;
    int nk = 0;
    if (natsMsgHeader_Keys(m, &keys, &nk) != NATS_OK || nk <= 0) {
        free((void *)keys);
        return FX_OK;
    }
    size_t len = sizeof HDR_LINE0 - 1 + 2;
    /* two passes: size, then write (values fetched twice; cheap, local map) */
    for (int pass = 0; pass < 2; pass++) {
        char *p = pass ? *out : NULL;
        if (pass) {
            memcpy(p, HDR_LINE0, sizeof HDR_LINE0 - 1);
            p += sizeof HDR_LINE0 - 1;
        }
        for (int i = 0; i < nk; i++) {
            const char **vals = NULL;
            int nv = 0;
            if (natsMsgHeader_Values(m, keys[i], &vals, &nv) != NATS_OK) continue;
            size_t kl = strlen(keys[i]);
            for (int j = 0; j < nv; j++) {
                size_t vl = strlen(vals[j]);
                if (!pass) {
                    len += kl + 2 + vl + 2;
                } else {
                    memcpy(p, keys[i], kl);
                    p += kl;
                    *p++ = ':';
                    *p++ = ' ';
                    memcpy(p, vals[j], vl);
                    p += vl;
                    *p++ = '\r';
                    *p++ = '\n';
                }
            }
            free((void *)vals);
        }
        if (!pass) {
            *out = malloc(len + 1);
            if (!*out) {
                free((void *)keys);
                return fx_seterr(FX_ENOMEM, "capture: out of memory");
            }
        } else {
            *p++ = '\r';
            *p++ = '\n';
            *p = '\0';
            *out_len = (size_t)(p - *out);
        }
    }
    free((void *)keys);
    return FX_OK;
}

fx_err dm_hdr_append(fx_slice block, const char *const *kv, size_t n_pairs, char **out,
                     size_t *out_len)
{
    size_t base = 0;
    const char *b = block.data;
    if (block.len >= sizeof HDR_LINE0 - 1 + 2 && memcmp(b + block.len - 2, "\r\n", 2) == 0)
        base = block.len - 2; /* drop the terminating empty line */
    size_t len = (base ? base : sizeof HDR_LINE0 - 1) + 2;
    for (size_t i = 0; i < n_pairs; i++) len += strlen(kv[2 * i]) + 2 + strlen(kv[2 * i + 1]) + 2;
    char *o = malloc(len + 1);
    if (!o) return fx_seterr(FX_ENOMEM, "headers: out of memory");
    char *p = o;
    if (base) {
        memcpy(p, b, base);
        p += base;
    } else {
        memcpy(p, HDR_LINE0, sizeof HDR_LINE0 - 1);
        p += sizeof HDR_LINE0 - 1;
    }
    for (size_t i = 0; i < n_pairs; i++)
        p = put_line(p, FX_SLICE_STR(kv[2 * i]), FX_SLICE_STR(kv[2 * i + 1]));
    *p++ = '\r';
    *p++ = '\n';
    *p = '\0';
    *out = o;
    *out_len = (size_t)(p - o);
    return FX_OK;
}

fx_err dm_hdr_delivery(fx_slice block, const char *const *kv, size_t n_pairs, char **buf,
                       size_t *cap, size_t *out_len)
{
    /* Upper bound: the stored lines, each at most one byte longer once rewritten (the space after
     * "k:"; a line is at least "k:\r\n", 4 bytes), the status line, our lines, the end. */
    size_t need = block.len + block.len / 4 + sizeof HDR_LINE0 + 4;
    for (size_t i = 0; i < n_pairs; i++) need += strlen(kv[2 * i]) + 2 + strlen(kv[2 * i + 1]) + 2;
    if (need > *cap) {
        size_t nc = *cap ? *cap : 1024;
        while (nc < need) nc *= 2;
        char *nb = realloc(*buf, nc);
        if (!nb) return fx_seterr(FX_ENOMEM, "headers: out of memory");
        *buf = nb;
        *cap = nc;
    }
    char *o = *buf;
    memcpy(o, HDR_LINE0, sizeof HDR_LINE0 - 1);
    o += sizeof HDR_LINE0 - 1;
    hdr_iter it;
    fx_slice k, v;
    dm_hdr_iter_init(&it, block.data, block.len);
    while (dm_hdr_iter_next(&it, &k, &v)) {
        bool ours = false; /* ours replace stored values of the same key (natsMsgHeader_Set) */
        for (size_t i = 0; i < n_pairs && !ours; i++)
            ours = strlen(kv[2 * i]) == k.len && memcmp(kv[2 * i], k.data, k.len) == 0;
        if (!ours) o = put_line(o, k, v);
    }
    for (size_t i = 0; i < n_pairs; i++)
        o = put_line(o, FX_SLICE_STR(kv[2 * i]), FX_SLICE_STR(kv[2 * i + 1]));
    *o++ = '\r';
    *o++ = '\n';
    *out_len = (size_t)(o - *buf);
    return FX_OK;
}

natsStatus dm_hdr_apply(natsMsg *m, fx_slice block)
{
    if (block.len < sizeof HDR_LINE0 - 1) return NATS_OK;
    char stackbuf[2048]; /* a copy, so each key and value can be NUL-terminated in place */
    char *buf = block.len < sizeof stackbuf ? stackbuf : malloc(block.len + 1);
    if (!buf) return NATS_NO_MEMORY;
    memcpy(buf, block.data, block.len);
    buf[block.len] = '\0';
    natsStatus s = NATS_OK;
    hdr_iter it;
    fx_slice k, v;
    dm_hdr_iter_init(&it, buf, block.len);
    while (s == NATS_OK && dm_hdr_iter_next(&it, &k, &v)) {
        buf[(const char *)k.data - buf + k.len] = '\0'; /* the ':' */
        buf[(const char *)v.data - buf + v.len] = '\0'; /* the '\r' of the line end */
        s = natsMsgHeader_Add(m, k.data, v.data);
    }
    if (buf != stackbuf) free(buf);
    return s;
}

