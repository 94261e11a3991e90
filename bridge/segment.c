/* segment.c -- payload segment codec. Contract: segment.h. */
#include "segment.h"

#include <string.h>

static const uint8_t MAGIC[4] = {'F', 'X', 'S', '1'};

static void put32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

size_t fx_seg_size(const fx_slice *vals, size_t n)
{
    size_t s = FX_SEG_HDR;
    for (size_t i = 0; i < n; i++) s += FX_SEG_PER_MSG + vals[i].len;
    return s;
}

size_t fx_seg_encode(const fx_slice *vals, size_t n, uint8_t *out, size_t cap)
{
    if (n == 0 || n > FX_SEG_MAX_MSGS || !out || cap < fx_seg_size(vals, n)) return 0;
    memcpy(out, MAGIC, 4);
    put32(out + 4, (uint32_t)n);
    uint8_t *p = out + FX_SEG_HDR;
    for (size_t i = 0; i < n; i++) {
        if (vals[i].len > UINT32_MAX) return 0;
        put32(p, (uint32_t)vals[i].len);
        if (vals[i].len) memcpy(p + 4, vals[i].data, vals[i].len);
        p += FX_SEG_PER_MSG + vals[i].len;
    }
    return (size_t)(p - out);
}

fx_err fx_seg_open(const void *data, size_t len, fx_seg_iter *it)
{
    const uint8_t *b = data;
    if (!b || len < FX_SEG_HDR || memcmp(b, MAGIC, 4) != 0)
        return fx_seterr(FX_EPROTO, "payload segment: bad header (%zu bytes)", len);
    uint32_t n = get32(b + 4);
    if (n == 0 || n > FX_SEG_MAX_MSGS)
        return fx_seterr(FX_EPROTO, "payload segment: message count %u out of range 1..%d", n,
                         FX_SEG_MAX_MSGS);
    const uint8_t *p = b + FX_SEG_HDR, *end = b + len;
    for (uint32_t i = 0; i < n; i++) {
        if ((size_t)(end - p) < FX_SEG_PER_MSG)
            return fx_seterr(FX_EPROTO, "payload segment: message %u: truncated length", i);
        uint32_t l = get32(p);
        if ((size_t)(end - p) - FX_SEG_PER_MSG < l)
            return fx_seterr(FX_EPROTO, "payload segment: message %u: length %u past the end", i,
                             l);
        p += FX_SEG_PER_MSG + l;
    }
    if (p != end)
        return fx_seterr(FX_EPROTO, "payload segment: %zu trailing bytes", (size_t)(end - p));
    *it = (fx_seg_iter){.p = b + FX_SEG_HDR, .end = end, .n = n, .left = n};
    return FX_OK;
}

int fx_seg_next(fx_seg_iter *it, fx_slice *msg)
{
    if (!it->left) return 0;
    uint32_t l = get32(it->p); /* validated by fx_seg_open */
    *msg = (fx_slice){it->p + FX_SEG_PER_MSG, l};
    it->p += FX_SEG_PER_MSG + l;
    it->left--;
    return 1;
}
