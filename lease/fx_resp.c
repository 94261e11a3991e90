/* fx_resp.c -- Redis request encoding into a caller-sized buffer. Contract: fx_resp.h. */
#include "fx_resp.h"

#include <string.h>

static size_t digits(size_t v)
{
    size_t n = 1;
    while (v >= 10) {
        v /= 10;
        n++;
    }
    return n;
}

/* <v>\r\n after the type byte t. */
static char *head(char *p, char t, size_t v)
{
    size_t n = digits(v);
    *p++ = t;
    for (size_t i = n; i-- > 0; v /= 10) p[i] = (char)('0' + v % 10);
    p += n;
    *p++ = '\r';
    *p++ = '\n';
    return p;
}

size_t fx_resp_arr_size(size_t n) { return 1 + digits(n) + 2; }

size_t fx_resp_bulk_size(size_t len) { return 1 + digits(len) + 2 + len + 2; }

size_t fx_resp_cmd_size(int argc, const size_t *lens)
{
    size_t s = fx_resp_arr_size((size_t)argc);
    for (int i = 0; i < argc; i++) s += fx_resp_bulk_size(lens[i]);
    return s;
}

char *fx_resp_arr(char *p, size_t n) { return head(p, '*', n); }

char *fx_resp_bulk_head(char *p, size_t len) { return head(p, '$', len); }

char *fx_resp_bulk_end(char *p)
{
    *p++ = '\r';
    *p++ = '\n';
    return p;
}

char *fx_resp_bulk(char *p, const void *data, size_t len)
{
    p = fx_resp_bulk_head(p, len);
    if (len) memcpy(p, data, len);
    return fx_resp_bulk_end(p + len);
}

char *fx_resp_cmd(char *p, int argc, const char *const *argv, const size_t *lens)
{
    p = fx_resp_arr(p, (size_t)argc);
    for (int i = 0; i < argc; i++) p = fx_resp_bulk(p, argv[i], lens[i]);
    return p;
}
