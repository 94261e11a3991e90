/* test_kv_redis.c -- the Redis backend of the KV payload store (lease/kv.h, lease/kv_redis.c)
 * against a real redis-server started by the harness.
 *
 * kv_redis_lease_semantics: lease_id 0 is a plain put that survives a lease's expiry; a lease put
 *   binds the key (gone with the lease); keepalive extends the lease (the LeaseManager keeps it
 *   alive well past its TTL through fx_lease_backend_kv) and reports FX_ELEASE_EXPIRED once it
 *   is gone; releasing the last handle never revokes (the key survives until the TTL runs out);
 *   get / get_range (zero-padded MQ-style keys, ascending, limit, [start,end) bounds, prefix
 *   ranges, merged across two leases) / count_prefix / delete_range / exact delete; re-putting
 *   a key with another lease re-binds it, in its own lease replaces it (one member); a range of
 *   one lease (fx_kv_get_range_lease) holds its keys only, in key order, NULs in values intact;
 *   a NUL in a key is refused; url parsing.
 * kv_redis_expiry_deletes_all_keys: 300 keys of one lease (3 batches) disappear at once: every
 *   count observed while polling is 300 or 0, never in between; keys of another lease stay.
 * kv_redis_put_on_expired_lease_fails: a put on an expired lease and on a never-granted lease
 *   fails with FX_ELEASE_EXPIRED and writes nothing (also not the other items of the batch, nor
 *   a lease set without TTL); a range of the gone lease is FX_ELEASE_EXPIRED, not empty.
 * kv_redis_down_and_back: with Redis killed, calls fail within their deadline with FX_EUNAVAIL;
 *   after a restart the same store works again without being re-created; with Redis frozen
 *   (SIGSTOP) a call fails with FX_ETIMEDOUT at its deadline, and works again after SIGCONT.
 * kv_redis_write_guard: CONFIG SET maxmemory-policy allkeys-lru at runtime: within one re-check
 *   period (200 ms here) puts and lease grants fail with FX_EUNAVAIL naming the policy, while
 *   reads, keepalives and deletes go on; fx_kv_redis_check says FX_EINVAL with the policy; with
 *   require_fsync, appendfsync everysec is refused the same way; back to noeviction, puts work.
 * kv_redis_full_refuses_puts: maxmemory below the used memory, noeviction: a put fails with
 *   FX_ENOSPACE before writing anything (the scripts are deny-oom as a whole): none of the keys
 *   exists, used_memory grew by less than the refused 1 MiB (a query buffer); keepalives, reads and deletes still work (they must, to drain a full Redis).
 * kv_redis_min_replicas_wait: min_replicas 1 without a replica: a put fails with FX_EUNAVAIL
 *   ("0 of 1 replica"); once a replica follows the primary, puts succeed.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hiredis/hiredis.h>

#include "kv.h"
#include "lease_mgr.h"
#include "tests/support/fxt.h"

typedef struct ctx {
    fxt_redis redis;
    fx_kv_store *s;
} ctx;

static int group_setup(void **state)
{
    ctx *x = calloc(1, sizeof *x);
    if (!x) return -1;
    if (fxt_redis_start(&x->redis) != 0) {
        free(x);
        return -1;
    }
    fx_kv_redis_opts o = {.url = x->redis.url, .prefix = "fxt/kv/", .default_timeout_ms = 2000};
    fx_err e = fx_kv_new_redis(&o, &x->s);
    if (e != FX_OK) {
        fprintf(stderr, "store: %s (%s)\n", fx_errname(e), fx_err_detail());
        fxt_redis_destroy(&x->redis);
        free(x);
        return -1;
    }
    *state = x;
    return 0;
}

static int group_teardown(void **state)
{
    ctx *x = *state;
    if (!x) return 0;
    fx_kv_store_free(x->s);
    fxt_redis_destroy(&x->redis);
    free(x);
    return 0;
}

static redisContext *raw(const fxt_redis *r)
{
    redisContext *c = redisConnect("127.0.0.1", r->port);
    assert_non_null(c);
    assert_int_equal(c->err, 0);
    return c;
}

/* A command's integer reply. */
static long long raw_int(const fxt_redis *r, const char *cmd)
{
    redisContext *c = raw(r);
    redisReply *rep = redisCommand(c, cmd);
    if (!rep || rep->type != REDIS_REPLY_INTEGER) fail_msg("redis %s: no integer", cmd);
    long long v = rep->integer;
    freeReplyObject(rep);
    redisFree(c);
    return v;
}

static void check_value(fx_kv_store *s, const char *key, const char *val)
{
    fx_bytes b = {0};
    fx_err e = fx_kv_get(s, FX_SLICE_STR(key), &b, 0);
    if (e != FX_OK) fprintf(stderr, "get %s: %s (%s)\n", key, fx_errname(e), fx_err_detail());
    assert_int_equal(e, FX_OK);
    assert_int_equal(b.len, strlen(val));
    assert_memory_equal(b.data, val, b.len);
    fx_bytes_free(&b);
}

static fx_err get_err(fx_kv_store *s, const char *key)
{
    fx_bytes b = {0};
    fx_err e = fx_kv_get(s, FX_SLICE_STR(key), &b, 0);
    fx_bytes_free(&b);
    return e;
}

static void put(fx_kv_store *s, const char *key, const char *val, int64_t lease)
{
    fx_kv_put_opts o = {.lease_id = lease};
    fx_err e = fx_kv_put(s, FX_SLICE_STR(key), FX_SLICE_STR(val), &o, 0);
    if (e != FX_OK) fprintf(stderr, "put %s: %s (%s)\n", key, fx_errname(e), fx_err_detail());
    assert_int_equal(e, FX_OK);
}

typedef struct gone_arg {
    fx_kv_store *s;
    const char *key;
} gone_arg;

static bool key_gone(void *arg)
{
    gone_arg *g = arg;
    return get_err(g->s, g->key) == FX_ENOTFOUND;
}

static void kv_redis_lease_semantics(void **state)
{
    ctx *x = *state;
    fx_kv_store *s = x->s;
    assert_true(fx_kv_is_redis(s));
    assert_null(fx_kv_etcd(s));
    assert_non_null(strstr(fx_kv_backend_uid(s), "redis("));

    int64_t l1 = 0, l2 = 0, ttl = 0;
    assert_int_equal(fx_kv_allocate_lease(s, 2, &l1, 0), FX_OK);
    assert_int_equal(fx_kv_allocate_lease(s, 30, &l2, 0), FX_OK);
    assert_true(l1 > 0 && l2 > 0 && l1 != l2);
    assert_int_equal(fx_kv_keepalive_lease(s, l2, &ttl, 0), FX_OK);
    assert_int_equal(ttl, 30);

    /* Plain put and lease put; the plain put never falls back to a lease. */
    put(s, "plain", "p", 0);
    put(s, "bound", "b", l1);
    check_value(s, "plain", "p");
    check_value(s, "bound", "b");

    /* The LeaseManager keeps l1 (ttl 2 s) alive well past its TTL. */
    fx_lease_mgr *m = NULL;
    assert_int_equal(fx_lease_mgr_new(NULL, &m), FX_OK);
    fx_lease_backend b = fx_lease_backend_kv(s);
    fx_lease *h = NULL;
    assert_int_equal(fx_lease_register(m, &b, 2, l1, NULL, &h), FX_OK);
    int64_t until = fxt_now_ms() + 4000;
    while (fxt_now_ms() < until) {
        check_value(s, "bound", "b"); /* polled for 4 s (2 TTLs): the key must stay all along */
        assert_false(fx_lease_is_expired(h));
    }
    assert_true(fx_lease_mgr_entry_keepalives(m, fx_kv_backend_uid(s), 2, l1) >= 3);
    /* Release never revokes: the key is still there right after the release ... */
    fx_lease_release(h);
    check_value(s, "bound", "b");
    /* ... and goes with the TTL. */
    gone_arg g = {s, "bound"};
    assert_true(fxt_wait_until(key_gone, &g, 8000));
    assert_int_equal(fx_kv_keepalive_lease(s, l1, NULL, 0), FX_ELEASE_EXPIRED);
    fx_lease_mgr_free(m);
    check_value(s, "plain", "p"); /* plain put survives the lease */

    /* MQ-style zero-padded keys over two leases: ranges merge in key order. */
    int64_t l3 = 0;
    assert_int_equal(fx_kv_allocate_lease(s, 30, &l3, 0), FX_OK);
    char key[64], val[64];
    for (int i = 0; i < 20; i++) {
        snprintf(key, sizeof key, "q/%020d", i);
        snprintf(val, sizeof val, "v%d", i);
        put(s, key, val, (i % 2) ? l2 : l3);
    }
    put(s, "q0", "other", l2); /* shares the "q" byte but not the "q/" prefix */
    fx_range_resp rr = {0};
    char lo[64], hi[64];
    snprintf(lo, sizeof lo, "q/%020d", 5);
    snprintf(hi, sizeof hi, "q/%020d", 15);
    assert_int_equal(fx_kv_get_range(s, FX_SLICE_STR(lo), FX_SLICE_STR(hi), 0, &rr, 0), FX_OK);
    assert_int_equal(rr.n_kvs, 10);
    for (size_t i = 0; i < rr.n_kvs; i++) {
        snprintf(key, sizeof key, "q/%020d", (int)i + 5);
        snprintf(val, sizeof val, "v%d", (int)i + 5);
        assert_int_equal(rr.kvs[i].key.len, strlen(key));
        assert_memory_equal(rr.kvs[i].key.data, key, strlen(key));
        assert_int_equal(rr.kvs[i].value.len, strlen(val));
        assert_memory_equal(rr.kvs[i].value.data, val, strlen(val));
    }
    fx_range_resp_free(&rr);
    assert_int_equal(fx_kv_get_range(s, FX_SLICE_STR(lo), FX_SLICE_STR(hi), 4, &rr, 0), FX_OK);
    assert_int_equal(rr.n_kvs, 4);
    assert_true(rr.more);
    assert_memory_equal(rr.kvs[3].key.data, "q/00000000000000000008", 22);
    fx_range_resp_free(&rr);
    /* prefix range (end empty) */
    assert_int_equal(fx_kv_get_range(s, FX_SLICE_STR("q/"), (fx_slice){NULL, 0}, 0, &rr, 0), FX_OK);
    assert_int_equal(rr.n_kvs, 20);
    fx_range_resp_free(&rr);
    int64_t n = 0;
    assert_int_equal(fx_kv_count_prefix(s, FX_SLICE_STR("q/"), &n, 0), FX_OK);
    assert_int_equal(n, 20);
    assert_int_equal(fx_kv_count_prefix(s, FX_SLICE_STR("q"), &n, 0), FX_OK);
    assert_int_equal(n, 21);

    /* Exact delete removes one key only; delete_range removes [lo, hi) over both leases. */
    snprintf(key, sizeof key, "q/%020d", 0);
    assert_int_equal(fx_kv_delete(s, FX_SLICE_STR(key), 0), FX_OK);
    assert_int_equal(get_err(s, key), FX_ENOTFOUND);
    assert_int_equal(fx_kv_count_prefix(s, FX_SLICE_STR("q/"), &n, 0), FX_OK);
    assert_int_equal(n, 19);
    assert_int_equal(fx_kv_delete_range(s, FX_SLICE_STR(lo), FX_SLICE_STR(hi), &n, 0), FX_OK);
    assert_int_equal(n, 10);
    assert_int_equal(fx_kv_count_prefix(s, FX_SLICE_STR("q/"), &n, 0), FX_OK);
    assert_int_equal(n, 9);

    /* Re-binding: a key put again with another lease lives in that lease only (one copy). */
    put(s, "moving", "one", l2);
    put(s, "moving", "two", l3);
    check_value(s, "moving", "two");
    assert_int_equal(fx_kv_count_prefix(s, FX_SLICE_STR("moving"), &n, 0), FX_OK);
    assert_int_equal(n, 1);

    /* Re-putting a key in its own lease replaces the value (one member, not two). */
    put(s, "same", "one", l2);
    put(s, "same", "two-longer", l2);
    check_value(s, "same", "two-longer");
    assert_int_equal(fx_kv_count_prefix(s, FX_SLICE_STR("same"), &n, 0), FX_OK);
    assert_int_equal(n, 1);

    /* A range of one lease: its keys only, in key order, limit honoured. */
    fx_kv_item many[3] = {{FX_SLICE_STR("rl/3"), FX_SLICE_STR("c")},
                          {FX_SLICE_STR("rl/1"), FX_SLICE_STR("a")},
                          {FX_SLICE_STR("rl/2"), (fx_slice){"b\0b", 3}}};
    fx_kv_put_opts mo = {.lease_id = l3};
    assert_int_equal(fx_kv_put_many(s, many, 3, &mo, 0), FX_OK);
    put(s, "rl/0", "other lease", l2);
    assert_int_equal(fx_kv_get_range_lease(s, l3, FX_SLICE_STR("rl/"), (fx_slice){NULL, 0}, 0, &rr,
                                           0), FX_OK);
    assert_int_equal(rr.n_kvs, 3);
    assert_memory_equal(rr.kvs[0].key.data, "rl/1", 4);
    assert_memory_equal(rr.kvs[2].key.data, "rl/3", 4);
    assert_int_equal(rr.kvs[1].value.len, 3); /* a NUL inside a value survives */
    assert_memory_equal(rr.kvs[1].value.data, "b\0b", 3);
    fx_range_resp_free(&rr);
    assert_int_equal(fx_kv_get_range_lease(s, l3, FX_SLICE_STR("rl/"), (fx_slice){NULL, 0}, 2, &rr,
                                           0), FX_OK);
    assert_int_equal(rr.n_kvs, 2);
    assert_memory_equal(rr.kvs[1].key.data, "rl/2", 4);
    fx_range_resp_free(&rr);
    assert_int_equal(fx_kv_delete_range(s, FX_SLICE_STR("rl/"), (fx_slice){NULL, 0}, &n, 0), FX_OK);
    assert_int_equal(n, 4);

    /* A NUL in a key is refused, a malformed url too. */
    fx_kv_put_opts po = {.lease_id = l2};
    assert_int_equal(fx_kv_put(s, (fx_slice){"a\0b", 3}, FX_SLICE_STR("x"), &po, 0), FX_EINVAL);
    fx_kv_store *bad = NULL;
    fx_kv_redis_opts bo = {.url = "http://127.0.0.1:1", .prefix = "x/"};
    assert_int_equal(fx_kv_new_redis(&bo, &bad), FX_EINVAL);
    bo.url = "rediss://127.0.0.1:1";
    assert_int_equal(fx_kv_new_redis(&bo, &bad), FX_EINVAL);
    assert_non_null(strstr(fx_err_detail(), "TLS"));
    bo.url = "redis://user:secret@127.0.0.1:1/3";
    assert_int_equal(fx_kv_new_redis(&bo, &bad), FX_OK);
    assert_null(strstr(fx_kv_backend_uid(bad), "secret"));
    assert_non_null(strstr(fx_kv_backend_uid(bad), "127.0.0.1:1/3"));
    fx_kv_store_free(bad);

    /* clean up the namespace for the next tests */
    assert_int_equal(fx_kv_delete_range(s, (fx_slice){NULL, 0}, (fx_slice){NULL, 0}, &n, 0), FX_OK);
}

typedef struct count_arg {
    fx_kv_store *s;
    int64_t full;
    int partial; /* counts seen that were neither full nor 0 */
    int samples;
} count_arg;

static bool count_zero(void *arg)
{
    count_arg *c = arg;
    int64_t n = -1;
    if (fx_kv_count_prefix(c->s, FX_SLICE_STR("exp/"), &n, 0) != FX_OK) return false;
    c->samples++;
    if (n != 0 && n != c->full) c->partial++;
    return n == 0;
}

static void kv_redis_expiry_deletes_all_keys(void **state)
{
    ctx *x = *state;
    fx_kv_store *s = x->s;
    int64_t l = 0, keep = 0, n = 0;
    assert_int_equal(fx_kv_allocate_lease(s, 1, &l, 0), FX_OK);
    assert_int_equal(fx_kv_allocate_lease(s, 30, &keep, 0), FX_OK);
    static char keys[300][32];
    fx_kv_item it[100];
    for (int b = 0; b < 3; b++) {
        for (int i = 0; i < 100; i++) {
            snprintf(keys[b * 100 + i], sizeof keys[0], "exp/%020d", b * 100 + i);
            it[i] = (fx_kv_item){FX_SLICE_STR(keys[b * 100 + i]), FX_SLICE_STR("payload")};
        }
        fx_kv_put_opts o = {.lease_id = l};
        assert_int_equal(fx_kv_put_many(s, it, 100, &o, 0), FX_OK);
    }
    put(s, "kept/1", "stays", keep);
    assert_int_equal(fx_kv_count_prefix(s, FX_SLICE_STR("exp/"), &n, 0), FX_OK);
    assert_int_equal(n, 300);
    count_arg c = {s, 300, 0, 0};
    assert_true(fxt_wait_until(count_zero, &c, 5000));
    assert_int_equal(c.partial, 0); /* never half-deleted */
    assert_true(c.samples >= 2);
    fx_range_resp rr = {0};
    assert_int_equal(fx_kv_get_range(s, FX_SLICE_STR("exp/"), (fx_slice){NULL, 0}, 0, &rr, 0), FX_OK);
    assert_int_equal(rr.n_kvs, 0);
    fx_range_resp_free(&rr);
    check_value(s, "kept/1", "stays");
    assert_int_equal(fx_kv_keepalive_lease(s, l, NULL, 0), FX_ELEASE_EXPIRED);
    assert_int_equal(fx_kv_delete(s, FX_SLICE_STR("kept/1"), 0), FX_OK);
}

static void kv_redis_put_on_expired_lease_fails(void **state)
{
    ctx *x = *state;
    fx_kv_store *s = x->s;
    int64_t l = 0;
    assert_int_equal(fx_kv_allocate_lease(s, 1, &l, 0), FX_OK);
    put(s, "pe/first", "ok", l);
    gone_arg g = {s, "pe/first"}; /* (polling with keepalives would keep it alive) */
    assert_true(fxt_wait_until(key_gone, &g, 4000));
    assert_int_equal(fx_kv_keepalive_lease(s, l, NULL, 0), FX_ELEASE_EXPIRED);
    fx_kv_item it[2] = {{FX_SLICE_STR("pe/a"), FX_SLICE_STR("1")},
                        {FX_SLICE_STR("pe/b"), FX_SLICE_STR("2")}};
    fx_kv_put_opts o = {.lease_id = l};
    fx_err e = fx_kv_put_many(s, it, 2, &o, 0);
    assert_int_equal(e, FX_ELEASE_EXPIRED);
    assert_non_null(strstr(fx_err_detail(), "not found"));
    assert_int_equal(get_err(s, "pe/a"), FX_ENOTFOUND);
    assert_int_equal(get_err(s, "pe/b"), FX_ENOTFOUND);
    assert_int_equal(get_err(s, "pe/first"), FX_ENOTFOUND);
    o.lease_id = 4242; /* never granted */
    assert_int_equal(fx_kv_put(s, FX_SLICE_STR("pe/c"), FX_SLICE_STR("3"), &o, 0), FX_ELEASE_EXPIRED);
    assert_int_equal(get_err(s, "pe/c"), FX_ENOTFOUND);
    int64_t n = -1;
    assert_int_equal(fx_kv_count_prefix(s, FX_SLICE_STR("pe/"), &n, 0), FX_OK);
    assert_int_equal(n, 0);
    /* A refused put leaves no set behind (no lease set without a TTL, which would never expire),
     * and a range of the gone lease says so instead of answering "no keys". */
    char cmd[96];
    snprintf(cmd, sizeof cmd, "EXISTS fxt/kv/l:%lld fxt/kv/l:4242", (long long)l);
    assert_int_equal(raw_int(&x->redis, cmd), 0);
    fx_range_resp rr = {0};
    assert_int_equal(fx_kv_get_range_lease(s, l, FX_SLICE_STR("pe/"), (fx_slice){NULL, 0}, 0, &rr,
                                           0), FX_ELEASE_EXPIRED);
    assert_non_null(strstr(fx_err_detail(), "is gone"));
    assert_int_equal(rr.n_kvs, 0);
}

static void kv_redis_down_and_back(void **state)
{
    ctx *x = *state;
    fx_kv_store *s = x->s;
    int64_t l = 0;
    assert_int_equal(fx_kv_allocate_lease(s, 60, &l, 0), FX_OK);
    put(s, "db/1", "before", l);
    assert_int_equal(fxt_redis_kill(&x->redis), 0);
    int64_t t0 = fxt_now_ms();
    fx_kv_put_opts o = {.lease_id = l};
    fx_err e = fx_kv_put(s, FX_SLICE_STR("db/2"), FX_SLICE_STR("x"), &o, 1000);
    assert_int_equal(e, FX_EUNAVAIL);
    assert_true(fxt_now_ms() - t0 < 1500);
    assert_int_equal(fxt_redis_restart(&x->redis), 0);
    /* No AOF in this group: Redis came back empty, so the lease is gone and says so. */
    assert_int_equal(fx_kv_put(s, FX_SLICE_STR("db/3"), FX_SLICE_STR("y"), &o, 0), FX_ELEASE_EXPIRED);
    int64_t l2 = 0;
    assert_int_equal(fx_kv_allocate_lease(s, 60, &l2, 0), FX_OK);
    assert_true(l2 > l); /* ids never repeat, also after data loss */
    put(s, "db/4", "after", l2);
    check_value(s, "db/4", "after");

    /* Redis frozen (SIGSTOP: connections stay open, nothing answers): the call times out at its
     * deadline; after SIGCONT the store works again (the timed-out connection was dropped). */
    assert_int_equal(kill(x->redis.pid, SIGSTOP), 0);
    t0 = fxt_now_ms();
    o.lease_id = l2;
    e = fx_kv_put(s, FX_SLICE_STR("db/5"), FX_SLICE_STR("z"), &o, 500);
    int64_t dt = fxt_now_ms() - t0;
    assert_int_equal(kill(x->redis.pid, SIGCONT), 0);
    assert_int_equal(e, FX_ETIMEDOUT);
    assert_true(dt >= 400 && dt < 1500);
    put(s, "db/6", "thawed", l2);
    check_value(s, "db/6", "thawed");
}

/* ---- write guard, OOM, WAIT ------------------------------------------------------------------- */

static void raw_cmd(const fxt_redis *r, const char *cmd)
{
    redisContext *c = raw(r);
    redisReply *rep = redisCommand(c, cmd);
    if (!rep || rep->type == REDIS_REPLY_ERROR) fail_msg("redis %s: %s", cmd, rep ? rep->str : c->errstr);
    freeReplyObject(rep);
    redisFree(c);
}

static long long used_memory(const fxt_redis *r)
{
    redisContext *c = raw(r);
    redisReply *rep = redisCommand(c, "INFO memory");
    assert_non_null(rep);
    const char *p = strstr(rep->str, "used_memory:");
    long long v = p ? atoll(p + 12) : -1;
    freeReplyObject(rep);
    redisFree(c);
    return v;
}

static fx_kv_store *guarded_store(const fxt_redis *r, bool require_fsync, int min_replicas)
{
    fx_kv_redis_opts o = {.url = r->url, .prefix = "fxt/guard/", .default_timeout_ms = 2000,
                          .require_fsync = require_fsync, .min_replicas = min_replicas,
                          .recheck_ms = 200};
    fx_kv_store *s = NULL;
    assert_int_equal(fx_kv_new_redis(&o, &s), FX_OK);
    return s;
}

typedef struct refused_arg {
    fx_kv_store *s;
    int64_t lease;
} refused_arg;

static bool put_refused(void *arg)
{
    refused_arg *a = arg;
    fx_kv_put_opts o = {.lease_id = a->lease};
    return fx_kv_put(a->s, FX_SLICE_STR("g/x"), FX_SLICE_STR("v"), &o, 0) == FX_EUNAVAIL;
}

static void kv_redis_write_guard(void **state)
{
    ctx *x = *state;
    fx_kv_store *s = guarded_store(&x->redis, false, 0);
    char why[256];
    assert_int_equal(fx_kv_redis_check(s, true, why, sizeof why, 0), FX_OK);
    int64_t l = 0;
    assert_int_equal(fx_kv_allocate_lease(s, 60, &l, 0), FX_OK);
    put(s, "g/a", "1", l);
    raw_cmd(&x->redis, "CONFIG SET maxmemory-policy allkeys-lru");
    refused_arg ra = {s, l};
    int64_t t0 = fxt_now_ms();
    assert_true(fxt_wait_until(put_refused, &ra, 1000)); /* within one re-check period + slack */
    fprintf(stderr, "  put refused %lld ms after CONFIG SET (re-check 200 ms): %s\n",
            (long long)(fxt_now_ms() - t0), fx_err_detail());
    assert_non_null(strstr(fx_err_detail(), "maxmemory-policy allkeys-lru"));
    int64_t l2 = 0;
    assert_int_equal(fx_kv_allocate_lease(s, 60, &l2, 0), FX_EUNAVAIL);
    check_value(s, "g/a", "1");                                    /* reads go on */
    assert_int_equal(fx_kv_keepalive_lease(s, l, NULL, 0), FX_OK); /* keepalives go on */
    assert_int_equal(fx_kv_delete(s, FX_SLICE_STR("g/a"), 0), FX_OK); /* deletes go on */
    assert_int_equal(fx_kv_redis_check(s, true, why, sizeof why, 0), FX_EINVAL);
    assert_non_null(strstr(why, "maxmemory-policy allkeys-lru"));
    fx_kv_redis_stats st;
    fx_kv_redis_get_stats(s, &st);
    assert_true(st.refused && st.refused_writes >= 2);
    raw_cmd(&x->redis, "CONFIG SET maxmemory-policy noeviction");
    assert_int_equal(fx_kv_redis_check(s, false, why, sizeof why, 0), FX_OK);
    put(s, "g/b", "2", l);
    fx_kv_store_free(s);

    /* require_fsync: this group's Redis has no AOF */
    s = guarded_store(&x->redis, true, 0);
    assert_int_equal(fx_kv_redis_check(s, true, why, sizeof why, 0), FX_EINVAL);
    assert_non_null(strstr(why, "kv.require_fsync: Redis has appendonly no"));
    fx_kv_put_opts o = {.lease_id = l};
    assert_int_equal(fx_kv_put(s, FX_SLICE_STR("g/c"), FX_SLICE_STR("3"), &o, 0), FX_EUNAVAIL);
    assert_int_equal(get_err(s, "g/c"), FX_ENOTFOUND);
    fx_kv_store_free(s);
}

static void kv_redis_full_refuses_puts(void **state)
{
    ctx *x = *state;
    fx_kv_store *s = guarded_store(&x->redis, false, 0);
    int64_t l = 0;
    assert_int_equal(fx_kv_allocate_lease(s, 60, &l, 0), FX_OK);
    put(s, "f/a", "1", l);
    long long used = used_memory(&x->redis);
    char cmd[64];
    snprintf(cmd, sizeof cmd, "CONFIG SET maxmemory %lld", used / 2);
    raw_cmd(&x->redis, cmd);
    static char big[256 * 1024];
    memset(big, 'b', sizeof big - 1);
    fx_kv_put_opts o = {.lease_id = l};
    for (int i = 0; i < 4; i++) {
        char key[32];
        snprintf(key, sizeof key, "f/big%d", i);
        fx_err e = fx_kv_put(s, FX_SLICE_STR(key), FX_SLICE_STR(big), &o, 0);
        if (e != FX_ENOSPACE) {
            raw_cmd(&x->redis, "CONFIG SET maxmemory 0");
            fail_msg("put %d on a full Redis: %s (%s), want FX_ENOSPACE", i, fx_errname(e), fx_err_detail());
        }
    }
    long long after = used_memory(&x->redis);
    check_value(s, "f/a", "1");
    assert_int_equal(fx_kv_keepalive_lease(s, l, NULL, 0), FX_OK);
    assert_int_equal(fx_kv_delete(s, FX_SLICE_STR("f/a"), 0), FX_OK);
    raw_cmd(&x->redis, "CONFIG SET maxmemory 0");
    fprintf(stderr, "  used_memory %lld before, %lld after 4 refused 256 KiB puts\n", used, after);
    for (int i = 0; i < 4; i++) { /* nothing was written */
        char key[32];
        snprintf(key, sizeof key, "f/big%d", i);
        assert_int_equal(get_err(s, key), FX_ENOTFOUND);
    }
    /* used_memory counts the connection's query buffer (the last 256 KiB request), not data */
    assert_true(after < used + 512 * 1024);
    fx_kv_redis_stats st;
    fx_kv_redis_get_stats(s, &st);
    assert_int_equal(st.oom, 4);
    fx_kv_store_free(s);
}

static bool replica_up(void *arg)
{
    fxt_redis *rep = arg;
    redisContext *c = raw(rep);
    redisReply *r = redisCommand(c, "INFO replication");
    bool up = r && r->str && strstr(r->str, "master_link_status:up");
    if (r) freeReplyObject(r);
    redisFree(c);
    return up;
}

static void kv_redis_min_replicas_wait(void **state)
{
    ctx *x = *state;
    fx_kv_store *s = guarded_store(&x->redis, false, 1);
    int64_t l = 0;
    assert_int_equal(fx_kv_allocate_lease(s, 60, &l, 0), FX_OK);
    fx_kv_put_opts o = {.lease_id = l};
    int64_t t0 = fxt_now_ms();
    fx_err e = fx_kv_put(s, FX_SLICE_STR("w/a"), FX_SLICE_STR("1"), &o, 500);
    assert_int_equal(e, FX_EUNAVAIL);
    assert_non_null(strstr(fx_err_detail(), "0 of 1 replica"));
    assert_true(fxt_now_ms() - t0 < 1500);
    fxt_redis rep;
    memset(&rep, 0, sizeof rep);
    assert_int_equal(fxt_redis_start(&rep), 0);
    char cmd[64];
    snprintf(cmd, sizeof cmd, "REPLICAOF 127.0.0.1 %d", x->redis.port);
    raw_cmd(&rep, cmd);
    assert_true(fxt_wait_until(replica_up, &rep, 10000));
    put(s, "w/b", "2", l);
    check_value(s, "w/b", "2");
    fx_kv_redis_stats st;
    fx_kv_redis_get_stats(s, &st);
    assert_int_equal(st.wait_short, 1);
    fxt_redis_destroy(&rep);
    fx_kv_store_free(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(kv_redis_lease_semantics),
        cmocka_unit_test(kv_redis_expiry_deletes_all_keys),
        cmocka_unit_test(kv_redis_put_on_expired_lease_fails),
        cmocka_unit_test(kv_redis_down_and_back),
        cmocka_unit_test(kv_redis_write_guard),
        cmocka_unit_test(kv_redis_full_refuses_puts),
        cmocka_unit_test(kv_redis_min_replicas_wait),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
