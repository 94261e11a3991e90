/* fuzz_leaf.c -- libFuzzer target: what the leafnode server sends (plugin/leaf.h). First the
 * protocol reader alone (plugin/leaf_proto.h: INFO, PING/PONG, +OK, -ERR, LS+/LS-, LMSG/HMSG with
 * their payloads), fed in two parts split at a point the input chooses and drained after each;
 * then the same bytes through fx_leaf_feed (the reader plus the frame handling the I/O thread
 * runs), then the queue-interest lookups the LS+ lines filled; and the URL parser (fx_url.h via
 * fx_leaf_url_parse) on the same bytes. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fx_log.h"
#include "leaf.h"
#include "leaf_proto.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int quiet;
    if (!quiet++) fx_log_set_level(FX_LOG_ERR);
    size_t cut = size ? data[0] % (size + 1) : 0;
    fx_lp_reader *r = fx_lp_reader_new(4096);
    if (!r) abort();
    fx_lp_frame f;
    int rc = 0;
    if (fx_lp_feed(r, data, cut) == 0)
        while ((rc = fx_lp_next(r, &f)) == 1)
            if (f.kind != FX_LP_LS_ADD && f.kind != FX_LP_LS_DEL && strlen(f.arg) != f.arg_len)
                abort(); /* LS lines are split into their tokens in place */
    if (rc == 0 && fx_lp_feed(r, data + cut, size - cut) == 0)
        while ((rc = fx_lp_next(r, &f)) == 1)
            if ((f.kind == FX_LP_LS_ADD || f.kind == FX_LP_LS_DEL) && !f.malformed && !f.subject)
                abort();
    if (fx_lp_buffered(r) > size) abort();
    fx_lp_reader_free(r);

    fx_leaf_opts o;
    memset(&o, 0, sizeof o);
    o.url = "nats://127.0.0.1:7422";
    o.name = "fuzz";
    fx_leaf *l = NULL;
    if (fx_leaf_new(&o, &l) != FX_OK) abort();
    if (fx_leaf_feed(l, data, cut) == 0) (void)fx_leaf_feed(l, data + cut, size - cut);
    char names[512];
    (void)fx_leaf_queue_names(l, "q.orders.alice", names, sizeof names);
    (void)fx_leaf_queue_names(l, "foo", names, sizeof names);
    fx_leaf_stats st;
    fx_leaf_get_stats(l, &st);
    fx_leaf_free(l);

    char *s = malloc(size + 1);
    if (!s) return 0;
    memcpy(s, data, size);
    s[size] = '\0';
    fx_leaf_url u;
    char err[160];
    if (fx_leaf_url_parse(s, &u, err, sizeof err) == 0) {
        if (u.port < 1 || u.port > 65535) abort();
    } else if (!err[0]) {
        abort();
    }
    free(s);
    return 0;
}
