/* fuzz_config.c -- libFuzzer target: the bridge configuration parser (plugin/config.h) on any
 * bytes: fx_config_parse must return 0 (and the result must free cleanly) or -1 with a non-empty,
 * NUL-terminated message; fx_parse_duration_ms on the same bytes as text. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "fx_log.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int quiet;
    if (!quiet++) fx_log_set_level(FX_LOG_ERR);
    char *json = malloc(size + 1); /* the parser's contract: json[0..len), not NUL-terminated */
    if (!json) return 0;
    memcpy(json, data, size);
    json[size] = 'x'; /* a stray byte past len must not be read as part of the document */
    fx_config c;
    char err[256];
    err[0] = '\0';
    int rc = fx_config_parse(json, size, &c, err, sizeof err);
    if (rc == 0) {
        if (!c.name || !c.name[0]) abort();
        for (size_t i = 0; i < c.n_channels; i++)
            if (!fx_config_channel(&c, c.channels[i].name)) abort();
        fx_config_free(&c);
    } else if (!err[0] || !memchr(err, '\0', sizeof err)) {
        abort(); /* a refusal always says why */
    }
    json[size] = '\0';
    int64_t ms = -1;
    (void)fx_parse_duration_ms(json, &ms);
    free(json);
    return 0;
}
