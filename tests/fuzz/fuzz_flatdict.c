/* fuzz_flatdict.c -- libFuzzer target: the FlatDict decoder and the MQ message record decoder
 * (bridge/flatdict.h) on any bytes, as read back from Fluxon MQ. Properties: a FlatDict that
 * decodes re-encodes to exactly the same bytes (the format has one encoding); an MQ record that
 * decodes has its slices inside the input and re-encodes to a record that decodes to the same
 * fields. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "flatdict.h"

#define MAX_ENTRIES 64
#define MAX_SIZE (1u << 20)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int same_slice(fx_slice a, fx_slice b)
{
    return a.len == b.len && (a.len == 0 || memcmp(a.data, b.data, a.len) == 0);
}

static int inside(fx_slice s, const uint8_t *buf, size_t len)
{
    return s.len == 0 || ((const uint8_t *)s.data >= buf && s.len <= len &&
                          (const uint8_t *)s.data - buf <= (ptrdiff_t)(len - s.len));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t *b = malloc(size ? size : 1); /* exact size: ASan sees a read past the end */
    if (!b) return 0;
    if (size) memcpy(b, data, size);

    static fx_fd_entry e[MAX_ENTRIES];
    size_t n = 0;
    if (fx_fd_decode(b, size, MAX_ENTRIES, MAX_SIZE, e, &n) == FX_OK) {
        for (size_t i = 0; i < n; i++)
            if (!inside(e[i].key, b, size) || !inside(e[i].val, b, size)) abort();
        fx_bytes out = {0};
        if (fx_fd_encode(e, n, &out) == FX_OK) {
            if (out.len != size || memcmp(out.data, b, size) != 0) abort();
            fx_bytes_free(&out);
        }
    }

    fx_mq_msg m, m2;
    if (fx_mq_msg_decode(b, size, MAX_SIZE, &m) == FX_OK) {
        if (!inside(m.subject, b, size) || !inside(m.headers, b, size) || !inside(m.data, b, size))
            abort();
        fx_bytes out = {0};
        if (fx_mq_msg_encode(&m, &out) == FX_OK) {
            if (fx_mq_msg_decode(out.data, out.len, MAX_SIZE, &m2) != FX_OK) abort();
            if (!same_slice(m.subject, m2.subject) || !same_slice(m.headers, m2.headers) ||
                !same_slice(m.data, m2.data) || m.publish_ns != m2.publish_ns)
                abort();
            fx_bytes_free(&out);
        }
    }
    free(b);
    return 0;
}
