/* fuzz_ack_subject.c -- libFuzzer target: the ack reply subject parser (plugin/jsack.h).
 * Property: a subject that parses rebuilds (fx_ack_subject_build) to a subject that parses to
 * the same fields; nothing is read past the terminating NUL. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "jsack.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *s = malloc(size + 1);
    if (!s) return 0;
    memcpy(s, data, size);
    s[size] = '\0';
    fx_ack_meta m, m2;
    if (fx_ack_subject_parse(s, &m) == 0) {
        if (!memchr(m.bridge, '\0', sizeof m.bridge) || !memchr(m.channel, '\0', sizeof m.channel) ||
            !memchr(m.claim, '\0', sizeof m.claim))
            abort();
        char out[FX_JSACK_SUBJECT_MAX];
        int n = fx_ack_subject_build(&m, out, sizeof out);
        if (n > 0) {
            if ((size_t)n >= sizeof out || out[n] != '\0') abort();
            if (fx_ack_subject_parse(out, &m2) != 0) abort();
            if (strcmp(m.bridge, m2.bridge) || strcmp(m.channel, m2.channel) ||
                strcmp(m.claim, m2.claim) || m.delivered != m2.delivered || m.seq != m2.seq ||
                m.claim_seq != m2.claim_seq || m.ts_ns != m2.ts_ns || m.pending != m2.pending ||
                m.nonce != m2.nonce)
                abort();
        }
    }
    free(s);
    return 0;
}
