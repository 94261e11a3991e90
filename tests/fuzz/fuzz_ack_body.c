/* fuzz_ack_body.c -- libFuzzer target: the ack body classifier (plugin/jsack.h) on any bytes (the
 * body is not NUL-terminated: it is read only within [0, len)). Properties: the kind is one of
 * the enum; a delay is reported only for -NAK (else 0) and is never negative. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "jsack.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* an exact-size heap copy, so ASan sees a read past len */
    uint8_t *b = malloc(size ? size : 1);
    if (!b) return 0;
    if (size) memcpy(b, data, size);
    int64_t delay = 12345;
    fx_ack_kind k = fx_ack_body_parse(b, size, &delay);
    if (k < FX_ACK_ACK || k > FX_ACK_INVALID) abort();
    if (k == FX_ACK_NAK && delay < 0) abort();
    if (k != FX_ACK_NAK && delay != 0) abort();
    free(b);
    return 0;
}
