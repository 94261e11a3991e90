/* fuzz_segment.c -- libFuzzer target: the payload segment reader (bridge/segment.h) on any bytes,
 * as read back from the payload plane. Properties: a segment that opens yields exactly n
 * messages, each inside the input, and re-encodes to exactly the same bytes. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "segment.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t *b = malloc(size ? size : 1);
    if (!b) return 0;
    if (size) memcpy(b, data, size);
    fx_seg_iter it;
    if (fx_seg_open(b, size, &it) == FX_OK) {
        static fx_slice v[FX_SEG_MAX_MSGS];
        uint32_t n = it.n, k = 0;
        fx_slice s;
        while (fx_seg_next(&it, &s)) {
            if (k >= n || k >= FX_SEG_MAX_MSGS) abort();
            if (s.len && ((const uint8_t *)s.data < b || (const uint8_t *)s.data + s.len > b + size))
                abort();
            v[k++] = s;
        }
        if (k != n) abort();
        if (fx_seg_size(v, k) != size) abort();
        uint8_t *o = malloc(size ? size : 1);
        if (!o) abort();
        if (fx_seg_encode(v, k, o, size) != size || memcmp(o, b, size) != 0) abort();
        free(o);
    }
    free(b);
    return 0;
}
