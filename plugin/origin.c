/* origin.c -- Fluxon-Origin: the keyed tag that proves a message is this bridge's own delivery
 * (loop prevention by proof). Contract: origin.h. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "origin.h"

/* SipHash-2-4 (Aumasson, Bernstein) of subject, a 0 byte and reply under a 128-bit key. */
#define ROTL(x, b) (((x) << (b)) | ((x) >> (64 - (b))))
#define SIPROUND                                                                                    \
    do {                                                                                            \
        v0 += v1; v1 = ROTL(v1, 13); v1 ^= v0; v0 = ROTL(v0, 32);                                   \
        v2 += v3; v3 = ROTL(v3, 16); v3 ^= v2;                                                      \
        v0 += v3; v3 = ROTL(v3, 21); v3 ^= v0;                                                      \
        v2 += v1; v1 = ROTL(v1, 17); v1 ^= v2; v2 = ROTL(v2, 32);                                   \
    } while (0)

typedef struct sip {
    uint64_t v0, v1, v2, v3, m;
    size_t n; /* bytes absorbed */
} sip;

static void sip_block(sip *h, uint64_t m)
{
    uint64_t v0 = h->v0, v1 = h->v1, v2 = h->v2, v3 = h->v3;
    v3 ^= m;
    SIPROUND;
    SIPROUND;
    v0 ^= m;
    h->v0 = v0, h->v1 = v1, h->v2 = v2, h->v3 = v3;
}

static void sip_bytes(sip *h, const void *p, size_t len)
{
    const uint8_t *b = p;
    for (size_t i = 0; i < len; i++) {
        h->m |= (uint64_t)b[i] << (8 * (h->n & 7));
        if ((++h->n & 7) == 0) {
            sip_block(h, h->m);
            h->m = 0;
        }
    }
}

static uint64_t siphash_origin(const uint64_t key[2], const char *subject, const char *reply)
{
    sip h = {.v0 = 0x736f6d6570736575ULL ^ key[0], .v1 = 0x646f72616e646f6dULL ^ key[1],
             .v2 = 0x6c7967656e657261ULL ^ key[0], .v3 = 0x7465646279746573ULL ^ key[1]};
    sip_bytes(&h, subject, strlen(subject));
    sip_bytes(&h, "", 1);
    if (reply) sip_bytes(&h, reply, strlen(reply));
    sip_block(&h, h.m | (uint64_t)(h.n & 0xff) << 56);
    uint64_t v0 = h.v0, v1 = h.v1, v2 = h.v2 ^ 0xff, v3 = h.v3;
    for (int i = 0; i < 4; i++) SIPROUND;
    return v0 ^ v1 ^ v2 ^ v3;
}

void dm_origin_tag(const uint64_t key[2], const char *subject, const char *reply, char *out,
                   size_t cap)
{
    snprintf(out, cap, "%016" PRIx64, siphash_origin(key, subject ? subject : "", reply));
}

bool dm_origin_ours(const uint64_t key[2], const char *subject, const char *reply,
                    const char *value)
{
    if (!value || strlen(value) != FX_DM_ORIGIN_LEN) return false;
    char want[FX_DM_ORIGIN_LEN + 1];
    dm_origin_tag(key, subject, reply, want, sizeof want);
    unsigned diff = 0; /* constant time: the tag is a secret */
    for (size_t i = 0; i < FX_DM_ORIGIN_LEN; i++) diff |= (unsigned)(want[i] ^ value[i]);
    return diff == 0;
}

