/* fuzz_leaf.c -- libFuzzer target: what the leafnode server sends (plugin/leaf.h): the protocol
 * line reader (INFO, PING/PONG, +OK, -ERR, LS+/LS-, LMSG/HMSG with their payloads) through
 * fx_leaf_feed, the same code the I/O thread runs on received bytes, split at a point the input
 * chooses (a line may arrive in two reads); then the queue-interest lookups the LS+ lines
 * filled; and the leaf URL parser on the same bytes. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fx_log.h"
#include "leaf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int quiet;
    if (!quiet++) fx_log_set_level(FX_LOG_ERR);
    fx_leaf_opts o;
    memset(&o, 0, sizeof o);
    o.url = "nats://127.0.0.1:7422";
    o.name = "fuzz";
    fx_leaf *l = NULL;
    if (fx_leaf_new(&o, &l) != FX_OK) abort();
    size_t cut = size ? data[0] % (size + 1) : 0;
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
