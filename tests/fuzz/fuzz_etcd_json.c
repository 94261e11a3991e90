/* fuzz_etcd_json.c -- libFuzzer target: every parser of an etcd gateway response body
 * (lease/etcd_json.h): range, put, delete, txn, header, lease grant / keepalive / time-to-live,
 * status, auth, error bodies and watch stream lines. The first byte picks the parser, the rest is
 * the body (not NUL-terminated: read only within [0, len)). Properties: on failure the result is
 * left zeroed (freeing it is safe, as the contract says); strings are NUL-terminated. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "etcd_json.h"
#include "fx_log.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int quiet;
    if (!quiet++) fx_log_set_level(FX_LOG_ERR);
    if (size < 1) return 0;
    unsigned sel = data[0];
    size_t len = size - 1;
    char *b = malloc(len ? len : 1); /* exact size: ASan sees a read past the end */
    if (!b) return 0;
    if (len) memcpy(b, data + 1, len);
    fx_err e;
    int64_t a = 0, c = 0;
    switch (sel % 13) {
    case 0: {
        fx_range_resp r;
        memset(&r, 0, sizeof r);
        e = fx_ej_parse_range(b, len, &r);
        if (e == FX_OK)
            for (size_t i = 0; i < r.n_kvs; i++)
                if ((r.kvs[i].key.len && !r.kvs[i].key.data)) abort();
        fx_range_resp_free(&r);
        break;
    }
    case 1: {
        fx_put_resp r;
        memset(&r, 0, sizeof r);
        (void)fx_ej_parse_put(b, len, &r);
        fx_put_resp_free(&r);
        break;
    }
    case 2: {
        fx_del_resp r;
        memset(&r, 0, sizeof r);
        (void)fx_ej_parse_del(b, len, &r);
        fx_del_resp_free(&r);
        break;
    }
    case 3: {
        fx_txn_resp r;
        memset(&r, 0, sizeof r);
        (void)fx_ej_parse_txn(b, len, &r);
        fx_txn_resp_free(&r);
        break;
    }
    case 4: (void)fx_ej_parse_header(b, len, &a); break;
    case 5: (void)fx_ej_parse_lease_grant(b, len, &a, &c); break;
    case 6: (void)fx_ej_parse_keepalive(b, len, &a); break;
    case 7: (void)fx_ej_parse_timetolive(b, len, &a, &c); break;
    case 8: {
        fx_etcd_status st;
        memset(&st, 0, sizeof st);
        (void)fx_ej_parse_status(b, len, &st);
        break;
    }
    case 9: {
        char *tok = NULL;
        e = fx_ej_parse_auth(b, len, &tok);
        if (e == FX_OK && !tok) abort();
        free(tok);
        break;
    }
    case 10: {
        fx_ej_error er;
        memset(&er, 0, sizeof er);
        (void)fx_ej_parse_error(500, b, len, &er);
        if (!memchr(er.message, '\0', sizeof er.message)) abort();
        (void)fx_ej_is_lease_not_found(er.message);
        break;
    }
    case 11: (void)fx_ej_grpc_code_by_name(b, len); break;
    default: {
        fx_ej_watch_line wl;
        memset(&wl, 0, sizeof wl);
        e = fx_ej_parse_watch_line(b, len, &wl);
        if (e == FX_OK && wl.n_events && !wl.events) abort();
        if (!memchr(wl.reason, '\0', sizeof wl.reason)) abort();
        fx_ej_watch_line_free(&wl);
        break;
    }
    }
    free(b);
    return 0;
}
