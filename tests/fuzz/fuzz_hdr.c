/* fuzz_hdr.c -- libFuzzer target: the NATS header block codec (plugin/hdr.h, hdr.c) on any
 * stored block, as read back from Fluxon MQ: dm_hdr_delivery (the delivery's header block:
 * stored lines + the bridge's own pairs, written into a buffer sized by its own bound),
 * dm_hdr_append, and dm_hdr_apply (the lines onto a cnats message). Properties:
 * the delivery block starts with "NATS/1.0\r\n", ends with an empty line, fits in the buffer
 * (ASan), and carries each of our pairs exactly once; dm_hdr_apply then dm_hdr_from_msg round
 * trips through cnats without error. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "hdr.h"
#include "fx_log.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static size_t count(const char *h, size_t n, const char *needle)
{
    size_t k = 0, nl = strlen(needle);
    for (const char *p = h; (p = memmem(p, n - (size_t)(p - h), needle, nl)) != NULL; p += nl) k++;
    return k;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int quiet;
    if (!quiet++) {
        fx_log_set_level(FX_LOG_ERR);
        if (nats_Open(-1) != NATS_OK) abort(); /* cnats' globals (natsMsg_Destroy needs them) */
    }
    char *b = malloc(size ? size : 1); /* exact size: ASan sees a read past the end */
    if (!b) return 0;
    if (size) memcpy(b, data, size);
    fx_slice block = {b, size};
    static const char *const kv[] = {"Fluxon-Channel", "orders", "Fluxon-Seq", "42"};

    char *buf = NULL;
    size_t cap = 0, len = 0;
    if (dm_hdr_delivery(block, kv, 2, &buf, &cap, &len) == FX_OK) {
        if (len > cap || len < 12 || memcmp(buf, "NATS/1.0\r\n", 10) != 0 ||
            memcmp(buf + len - 4, "\r\n\r\n", 4) != 0)
            abort();
        if (count(buf, len, "\r\nFluxon-Channel: orders\r\n") != 1) abort();
    }
    free(buf);

    char *ap = NULL;
    size_t al = 0;
    if (dm_hdr_append(block, kv, 2, &ap, &al) == FX_OK) {
        if (ap[al] != '\0' || al < 4 || memcmp(ap + al - 2, "\r\n", 2) != 0) abort();
        free(ap);
    }

    /* One message for the whole run, its headers removed after each input: creating and
     * destroying a natsMsg per input goes through cnats' GC thread (about 1 ms each). */
    static natsMsg *m;
    if (!m && natsMsg_Create(&m, "orders.x", NULL, "d", 1) != NATS_OK) abort();
    if (dm_hdr_apply(m, block) == NATS_OK) {
        char *out = NULL;
        size_t ol = 0;
        if (dm_hdr_from_msg(m, &out, &ol) != FX_OK) abort();
        free(out);
    }
    const char **keys = NULL;
    int nk = 0;
    if (natsMsgHeader_Keys(m, &keys, &nk) == NATS_OK) {
        for (int i = 0; i < nk; i++)
            if (natsMsgHeader_Delete(m, keys[i]) != NATS_OK) abort();
        free((void *)keys);
    }
    free(b);
    return 0;
}
