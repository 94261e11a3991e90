/* Unit tests for bridge/keys.c: layout, prefixes, parsers, strictness, fuzz. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "keys.h"

static fx_mq_keys K;  /* default root */
static fx_mq_keys KC; /* custom root */

static int setup(void **state)
{
    (void)state;
    if (fx_mq_keys_init(&K, NULL) != FX_OK) return -1;
    if (fx_mq_keys_init(&KC, "/x/y-z") != FX_OK) return -1;
    return 0;
}

#define KEQ(call, expect)                                                                          \
    do {                                                                                           \
        fx_mq_key k_;                                                                              \
        assert_int_equal((call), FX_OK);                                                           \
        assert_string_equal(k_.s, (expect));                                                       \
        assert_int_equal(k_.len, strlen(expect));                                                  \
    } while (0)
/* The macro's key variable is k_: calls write into &k_. */

static fx_slice S(const char *s) { return (fx_slice){s, strlen(s)}; }

/* ---- root ------------------------------------------------------------------------------------- */

static void test_root_validation(void **state)
{
    (void)state;
    fx_mq_keys k;
    assert_int_equal(fx_mq_keys_init(&k, NULL), FX_OK);
    assert_string_equal(k.root, "/fluxon");
    assert_int_equal(k.root_len, 7);
    assert_int_equal(fx_mq_keys_init(&k, "/a"), FX_OK);
    assert_int_equal(fx_mq_keys_init(&k, "/a/b.c_d-e~"), FX_OK);
    const char *bad[] = {"", "/", "a", "fluxon", "/fluxon/", "//a", "/a//b", "/a b", "/a\tb",
                         "/a\x7f", "/\xc3\xa9", "/a/"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(fx_mq_keys_init(&k, bad[i]), FX_EINVAL);
        assert_int_equal(k.root_len, 0);
        assert_true(strlen(fx_err_detail()) > 0);
    }
    char longr[FX_MQ_ROOT_MAX + 2];
    longr[0] = '/';
    memset(longr + 1, 'r', FX_MQ_ROOT_MAX);
    longr[FX_MQ_ROOT_MAX + 1] = '\0'; /* 129 bytes */
    assert_int_equal(fx_mq_keys_init(&k, longr), FX_EINVAL);
    longr[FX_MQ_ROOT_MAX] = '\0'; /* 128 bytes */
    assert_int_equal(fx_mq_keys_init(&k, longr), FX_OK);
    assert_int_equal(k.root_len, FX_MQ_ROOT_MAX);
    assert_int_equal(fx_mq_keys_init(NULL, "/a"), FX_EINVAL);
    assert_int_equal(fx_mq_root_validate(NULL), FX_EINVAL);

    /* An uninitialised / failed context builds nothing. */
    fx_mq_keys z;
    memset(&z, 0, sizeof z);
    fx_mq_key out;
    assert_int_equal(fx_mq_key_chan_meta(&z, 1, &out), FX_EINVAL);
    assert_int_equal(out.len, 0);
    assert_int_equal(fx_mq_key_chan_meta(NULL, 1, &out), FX_EINVAL);
    assert_int_equal(fx_mq_key_chan_meta(&K, 1, NULL), FX_EINVAL);
}

static void test_role_name(void **state)
{
    (void)state;
    assert_string_equal(fx_mq_role_name(FX_MQ_ROLE_PRODUCER), "producer");
    assert_string_equal(fx_mq_role_name(FX_MQ_ROLE_CONSUMER), "consumer");
    assert_string_equal(fx_mq_role_name((fx_mq_role)7), "?");
}

/* ---- every key, exact text ---------------------------------------------------------------------- */

static void test_mpsc_keys(void **state)
{
    (void)state;
    KEQ(fx_mq_key_chan_meta(&K, 17, &k_), "/fluxon/channels/meta/17");
    KEQ(fx_mq_key_producer_member(&K, 17, 3, &k_), "/fluxon/channels/17/producer/producer_3");
    KEQ(fx_mq_key_producer_weight(&K, 17, 3, &k_), "/fluxon/channels/17/producer_weight/3");
    KEQ(fx_mq_key_consumer_member(&K, 17, 4, &k_), "/fluxon/channels/17/consumer/consumer_4");
    KEQ(fx_mq_key_produce_offset(&K, 17, 3, &k_),
        "/fluxon/channels/17/producer_offset_of_all_producer/3");
    KEQ(fx_mq_key_consume_offset(&K, 17, 3, &k_),
        "/fluxon/channels/17/consumer_offset_of_all_producer/3");
    KEQ(fx_mq_prefix_chan(&K, 17, &k_), "/fluxon/channels/17/");
    KEQ(fx_mq_prefix_producer_members(&K, 17, &k_), "/fluxon/channels/17/producer/");
    KEQ(fx_mq_prefix_consumer_members(&K, 17, &k_), "/fluxon/channels/17/consumer/");
    KEQ(fx_mq_prefix_producer_weights(&K, 17, &k_), "/fluxon/channels/17/producer_weight/");
    KEQ(fx_mq_prefix_produce_offsets(&K, 17, &k_),
        "/fluxon/channels/17/producer_offset_of_all_producer/");
    KEQ(fx_mq_prefix_consume_offsets(&K, 17, &k_),
        "/fluxon/channels/17/consumer_offset_of_all_producer/");
    /* custom root and extreme ids */
    KEQ(fx_mq_key_chan_meta(&KC, 0, &k_), "/x/y-z/channels/meta/0");
    KEQ(fx_mq_key_produce_offset(&KC, INT64_MAX, INT64_MAX, &k_),
        "/x/y-z/channels/9223372036854775807/producer_offset_of_all_producer/9223372036854775807");
}

static void test_mpmc_keys(void **state)
{
    (void)state;
    KEQ(fx_mq_key_mpmc_meta(&K, 5, &k_), "/fluxon/mpmc_channels/5/meta");
    KEQ(fx_mq_key_mpmc_next_channel_id(&K, 5, &k_), "/fluxon/mpmc_channels/5/next_channel_id");
    KEQ(fx_mq_key_mpmc_mpsc_channels(&K, 5, &k_), "/fluxon/mpmc_channels/5/mpsc_channels");
    KEQ(fx_mq_key_mpmc_create_lock(&K, 5, &k_), "/fluxon/mpmc_channels/5/create_lock");
    KEQ(fx_mq_key_mpmc_role(&K, FX_MQ_ROLE_PRODUCER, 5, 33, &k_),
        "/fluxon/mpmc_channels/producer/5/33");
    KEQ(fx_mq_key_mpmc_role(&K, FX_MQ_ROLE_CONSUMER, 5, 33, &k_),
        "/fluxon/mpmc_channels/consumer/5/33");
    KEQ(fx_mq_key_mpmc_ready(&K, 5, 17, &k_), "/fluxon/mpmc_channels/ready/5/17");
    KEQ(fx_mq_prefix_mpmc(&K, 5, &k_), "/fluxon/mpmc_channels/5/");
    KEQ(fx_mq_prefix_mpmc_role(&K, FX_MQ_ROLE_CONSUMER, 5, &k_), "/fluxon/mpmc_channels/consumer/5/");
    KEQ(fx_mq_prefix_mpmc_role(&K, FX_MQ_ROLE_PRODUCER, 5, &k_), "/fluxon/mpmc_channels/producer/5/");
    KEQ(fx_mq_prefix_mpmc_ready(&K, 5, &k_), "/fluxon/mpmc_channels/ready/5/");
    fx_mq_key k;
    assert_int_equal(fx_mq_key_mpmc_role(&K, (fx_mq_role)2, 5, 1, &k), FX_EINVAL);
    assert_int_equal(k.len, 0);
    assert_int_equal(fx_mq_prefix_mpmc_role(&K, (fx_mq_role)-1, 5, &k), FX_EINVAL);
}

static void test_global_keys(void **state)
{
    (void)state;
    KEQ(fx_mq_key_alloc_chan_ids(&K, &k_), "/fluxon/dist_id_allocator/channels");
    KEQ(fx_mq_key_alloc_producer_idx(&K, 17, &k_), "/fluxon/dist_id_allocator/channels/17");
    KEQ(fx_mq_key_alloc_consumer_idx(&K, 17, &k_),
        "/fluxon/dist_id_allocator/channels/17/consumers");
    KEQ(fx_mq_prefix_alloc_chan(&K, 17, &k_), "/fluxon/dist_id_allocator/channels/17/");
    KEQ(fx_mq_key_alloc_mpmc_ids(&K, &k_), "/fluxon/dist_id_allocator/mpmc_channels");
    KEQ(fx_mq_key_alloc_mpmc_member_ids(&K, 5, &k_), "/fluxon/dist_id_allocator/mpmc_channels/5");
    KEQ(fx_mq_key_cluster_lease_chan(&K, 17, &k_), "/fluxon/cluster_lease/channels/17");
    KEQ(fx_mq_key_cluster_lease_id_alloc(&K, 17, &k_),
        "/fluxon/cluster_lease/id_allocator/channels/17");
    KEQ(fx_mq_key_unique(&K, "orders", &k_), "/fluxon/mq_unique_keys/orders");
    KEQ(fx_mq_key_unique_lock(&K, "orders", &k_), "/fluxon/mq_unique_locks/orders");
    KEQ(fx_mq_prefix_unique(&K, &k_), "/fluxon/mq_unique_keys/");
    KEQ(fx_mq_key_unique(&KC, "orders-dlq", &k_), "/x/y-z/mq_unique_keys/orders-dlq");
    KEQ(fx_mq_key_unique(&K, "\xc3\xa9t\xc3\xa9", &k_), "/fluxon/mq_unique_keys/\xc3\xa9t\xc3\xa9");
}

static void test_names(void **state)
{
    (void)state;
    fx_mq_key k;
    const char *bad[] = {"", "a/b", "a b", "a\nb", "\x7f", "/", "a\x01"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(fx_mq_name_validate(bad[i]), FX_EINVAL);
        assert_int_equal(fx_mq_key_unique(&K, bad[i], &k), FX_EINVAL);
        assert_int_equal(k.len, 0);
        assert_int_equal(fx_mq_key_unique_lock(&K, bad[i], &k), FX_EINVAL);
    }
    assert_int_equal(fx_mq_name_validate(NULL), FX_EINVAL);
    assert_int_equal(fx_mq_key_unique(&K, NULL, &k), FX_EINVAL);
    char n[FX_MQ_NAME_MAX + 2];
    memset(n, 'n', sizeof n);
    n[FX_MQ_NAME_MAX] = '\0';
    assert_int_equal(fx_mq_name_validate(n), FX_OK);
    /* longest root + longest name still fits */
    char r[FX_MQ_ROOT_MAX + 1];
    r[0] = '/';
    memset(r + 1, 'r', FX_MQ_ROOT_MAX - 1);
    r[FX_MQ_ROOT_MAX] = '\0';
    fx_mq_keys kl;
    assert_int_equal(fx_mq_keys_init(&kl, r), FX_OK);
    assert_int_equal(fx_mq_key_unique_lock(&kl, n, &k), FX_OK);
    assert_int_equal(k.len, FX_MQ_ROOT_MAX + strlen("/mq_unique_locks/") + FX_MQ_NAME_MAX);
    assert_int_equal(fx_mq_key_cluster_lease_id_alloc(&kl, INT64_MAX, &k), FX_OK);
    n[FX_MQ_NAME_MAX] = 'n';
    n[FX_MQ_NAME_MAX + 1] = '\0';
    assert_int_equal(fx_mq_name_validate(n), FX_EINVAL);
}

static void test_negative_ids(void **state)
{
    (void)state;
    fx_mq_key k, k2;
    assert_int_equal(fx_mq_key_chan_meta(&K, -1, &k), FX_EINVAL);
    assert_int_equal(k.len, 0);
    assert_string_equal(k.s, "");
    assert_non_null(strstr(fx_err_detail(), "chan"));
    assert_int_equal(fx_mq_key_producer_member(&K, 1, -1, &k), FX_EINVAL);
    assert_non_null(strstr(fx_err_detail(), "pidx"));
    assert_int_equal(fx_mq_key_produce_offset(&K, INT64_MIN, 0, &k), FX_EINVAL);
    assert_int_equal(fx_mq_key_mpmc_ready(&K, 1, -5, &k), FX_EINVAL);
    assert_int_equal(fx_mq_key_mpmc_role(&K, FX_MQ_ROLE_CONSUMER, -1, 1, &k), FX_EINVAL);
    assert_int_equal(fx_mq_key_alloc_mpmc_member_ids(&K, -1, &k), FX_EINVAL);
    assert_int_equal(fx_mq_payload_key(1, 2, 3, -1, &k), FX_EINVAL);
    assert_non_null(strstr(fx_err_detail(), "msgid"));
    assert_int_equal(fx_mq_payload_key(-1, 2, 3, 1, &k), FX_EINVAL);
    assert_int_equal(fx_mq_payload_prefix_mpsc(1, -2, &k), FX_EINVAL);
    assert_int_equal(fx_mq_payload_prefix_producer(1, 2, -3, &k), FX_EINVAL);
    assert_int_equal(fx_mq_payload_prefix_mpmc(-1, &k), FX_EINVAL);
    assert_int_equal(fx_mq_mpsc_payload_key(1, 2, -3, &k), FX_EINVAL);
    assert_int_equal(fx_mq_mpsc_payload_prefix_chan(-1, &k), FX_EINVAL);
    assert_int_equal(fx_mq_mpsc_payload_prefix_producer(1, -1, &k), FX_EINVAL);
    assert_int_equal(fx_mq_payload_range(1, 2, 3, 5, 4, &k, &k2), FX_EINVAL);
    assert_int_equal(fx_mq_payload_range(1, 2, 3, -1, 4, &k, &k2), FX_EINVAL);
    assert_int_equal(fx_mq_payload_range(1, 2, 3, 0, 4, NULL, &k2), FX_EINVAL);
    assert_int_equal(fx_mq_payload_range(-1, 2, 3, 0, 4, &k, &k2), FX_EINVAL);
    assert_int_equal(k.len, 0);
    assert_int_equal(k2.len, 0);
}

/* ---- prefix relationships ---------------------------------------------------------------------- */

static int has_prefix(const fx_mq_key *k, const fx_mq_key *p)
{
    return k->len >= p->len && memcmp(k->s, p->s, p->len) == 0;
}

static void test_prefix_relations(void **state)
{
    (void)state;
    fx_mq_key p, k;
    /* each key is under its prefix */
    assert_int_equal(fx_mq_prefix_produce_offsets(&K, 1, &p), FX_OK);
    assert_int_equal(fx_mq_key_produce_offset(&K, 1, 9, &k), FX_OK);
    assert_true(has_prefix(&k, &p));
    /* chan 1's prefixes do not cover chan 17 */
    assert_int_equal(fx_mq_key_produce_offset(&K, 17, 9, &k), FX_OK);
    assert_false(has_prefix(&k, &p));
    assert_int_equal(fx_mq_prefix_chan(&K, 1, &p), FX_OK);
    assert_false(has_prefix(&k, &p));
    /* the member prefix covers only memberships, not weights or offsets */
    assert_int_equal(fx_mq_prefix_producer_members(&K, 17, &p), FX_OK);
    assert_int_equal(fx_mq_key_producer_member(&K, 17, 2, &k), FX_OK);
    assert_true(has_prefix(&k, &p));
    assert_int_equal(fx_mq_key_producer_weight(&K, 17, 2, &k), FX_OK);
    assert_false(has_prefix(&k, &p));
    assert_int_equal(fx_mq_key_produce_offset(&K, 17, 2, &k), FX_OK);
    assert_false(has_prefix(&k, &p));
    /* the channel meta key is not under the channel prefix (rollback deletes it separately) */
    assert_int_equal(fx_mq_prefix_chan(&K, 17, &p), FX_OK);
    assert_int_equal(fx_mq_key_chan_meta(&K, 17, &k), FX_OK);
    assert_false(has_prefix(&k, &p));
    /* ready prefix of mpmc 1 does not cover mpmc 12 */
    assert_int_equal(fx_mq_prefix_mpmc_ready(&K, 1, &p), FX_OK);
    assert_int_equal(fx_mq_key_mpmc_ready(&K, 12, 3, &k), FX_OK);
    assert_false(has_prefix(&k, &p));
    assert_int_equal(fx_mq_key_mpmc_ready(&K, 1, 3, &k), FX_OK);
    assert_true(has_prefix(&k, &p));
    /* role prefix */
    assert_int_equal(fx_mq_prefix_mpmc_role(&K, FX_MQ_ROLE_CONSUMER, 1, &p), FX_OK);
    assert_int_equal(fx_mq_key_mpmc_role(&K, FX_MQ_ROLE_CONSUMER, 1, 7, &k), FX_OK);
    assert_true(has_prefix(&k, &p));
    assert_int_equal(fx_mq_key_mpmc_role(&K, FX_MQ_ROLE_PRODUCER, 1, 7, &k), FX_OK);
    assert_false(has_prefix(&k, &p));
    /* mpmc prefix covers its meta keys but no role/ready key */
    assert_int_equal(fx_mq_prefix_mpmc(&K, 1, &p), FX_OK);
    assert_int_equal(fx_mq_key_mpmc_mpsc_channels(&K, 1, &k), FX_OK);
    assert_true(has_prefix(&k, &p));
    assert_int_equal(fx_mq_key_mpmc_ready(&K, 1, 3, &k), FX_OK);
    assert_false(has_prefix(&k, &p));
    /* allocator rollback prefix: covers the consumer counter, not the producer counter */
    assert_int_equal(fx_mq_prefix_alloc_chan(&K, 17, &p), FX_OK);
    assert_int_equal(fx_mq_key_alloc_consumer_idx(&K, 17, &k), FX_OK);
    assert_true(has_prefix(&k, &p));
    assert_int_equal(fx_mq_key_alloc_producer_idx(&K, 17, &k), FX_OK);
    assert_false(has_prefix(&k, &p));
    /* payload prefixes */
    assert_int_equal(fx_mq_payload_key(3, 17, 5, 42, &k), FX_OK);
    assert_int_equal(fx_mq_payload_prefix_mpmc(3, &p), FX_OK);
    assert_true(has_prefix(&k, &p));
    assert_int_equal(fx_mq_payload_prefix_mpsc(3, 17, &p), FX_OK);
    assert_true(has_prefix(&k, &p));
    assert_int_equal(fx_mq_payload_prefix_producer(3, 17, 5, &p), FX_OK);
    assert_true(has_prefix(&k, &p));
    assert_int_equal(fx_mq_payload_prefix_mpsc(3, 1, &p), FX_OK);
    assert_false(has_prefix(&k, &p));
    assert_int_equal(fx_mq_payload_prefix_mpmc(31, &p), FX_OK);
    assert_false(has_prefix(&k, &p));
    assert_int_equal(fx_mq_payload_prefix_producer(3, 17, 55, &p), FX_OK);
    assert_false(has_prefix(&k, &p));
}

/* ---- payload keys ------------------------------------------------------------------------------- */

static void test_payload_keys(void **state)
{
    (void)state;
    KEQ(fx_mq_payload_key(3, 17, 5, 42, &k_), "mpmc/3/mpsc_17/producer/5/msg_00000000000000000042");
    KEQ(fx_mq_payload_key(0, 0, 0, 0, &k_), "mpmc/0/mpsc_0/producer/0/msg_00000000000000000000");
    KEQ(fx_mq_payload_key(1, 1, 1, INT64_MAX, &k_),
        "mpmc/1/mpsc_1/producer/1/msg_09223372036854775807");
    KEQ(fx_mq_payload_prefix_mpmc(3, &k_), "mpmc/3/");
    KEQ(fx_mq_payload_prefix_mpsc(3, 17, &k_), "mpmc/3/mpsc_17/");
    KEQ(fx_mq_payload_prefix_producer(3, 17, 5, &k_), "mpmc/3/mpsc_17/producer/5/msg_");
    KEQ(fx_mq_mpsc_payload_key(17, 5, 42, &k_), "mpscchan_17_producer_5_msg_00000000000000000042");
    KEQ(fx_mq_mpsc_payload_prefix_chan(17, &k_), "mpscchan_17_");
    KEQ(fx_mq_mpsc_payload_prefix_producer(17, 5, &k_), "mpscchan_17_producer_5_msg_");

    fx_mq_key a, b;
    assert_int_equal(fx_mq_payload_range(3, 17, 5, 10, 20, &a, &b), FX_OK);
    assert_string_equal(a.s, "mpmc/3/mpsc_17/producer/5/msg_00000000000000000010");
    assert_string_equal(b.s, "mpmc/3/mpsc_17/producer/5/msg_00000000000000000020");
    assert_int_equal(fx_mq_payload_range(3, 17, 5, 7, 7, &a, &b), FX_OK); /* empty range */
    assert_string_equal(a.s, b.s);
    assert_int_equal(fx_mq_payload_range(3, 17, 5, 0, INT64_MAX, &a, &b), FX_OK);

    /* byte order == numeric order for ids across digit-count boundaries */
    srand(12345);
    int64_t ids[] = {0, 1, 9, 10, 99, 100, 999, 1000, 123456789, 1000000000000LL, INT64_MAX - 1,
                     INT64_MAX};
    size_t nid = sizeof ids / sizeof ids[0];
    for (size_t i = 0; i < nid; i++)
        for (size_t j = 0; j < nid; j++) {
            assert_int_equal(fx_mq_payload_key(1, 2, 3, ids[i], &a), FX_OK);
            assert_int_equal(fx_mq_payload_key(1, 2, 3, ids[j], &b), FX_OK);
            int c = strcmp(a.s, b.s);
            assert_true((c < 0) == (ids[i] < ids[j]) && (c == 0) == (ids[i] == ids[j]));
        }
    for (int r = 0; r < 2000; r++) {
        int64_t x = ((int64_t)rand() << 31 | rand()) >> (rand() % 40);
        int64_t y = ((int64_t)rand() << 31 | rand()) >> (rand() % 40);
        assert_int_equal(fx_mq_payload_key(1, 2, 3, x, &a), FX_OK);
        assert_int_equal(fx_mq_payload_key(1, 2, 3, y, &b), FX_OK);
        int c = strcmp(a.s, b.s);
        assert_true((c < 0) == (x < y));
        /* membership in [from, to) by byte comparison matches numeric membership */
        if (x <= y) {
            fx_mq_key s, e, m;
            int64_t z = ((int64_t)rand() << 31 | rand()) >> (rand() % 40);
            assert_int_equal(fx_mq_payload_range(1, 2, 3, x, y, &s, &e), FX_OK);
            assert_int_equal(fx_mq_payload_key(1, 2, 3, z, &m), FX_OK);
            int in = strcmp(m.s, s.s) >= 0 && strcmp(m.s, e.s) < 0;
            assert_int_equal(in, z >= x && z < y);
        }
    }
}

static void test_parse_payload(void **state)
{
    (void)state;
    int64_t m = -1, c = -1, p = -1, id = -1;
    assert_int_equal(
        fx_mq_parse_payload_key(S("mpmc/3/mpsc_17/producer/5/msg_00000000000000000042"), &m, &c,
                                &p, &id),
        FX_OK);
    assert_int_equal(m, 3);
    assert_int_equal(c, 17);
    assert_int_equal(p, 5);
    assert_int_equal(id, 42);
    assert_int_equal(fx_mq_parse_payload_key(S("mpmc/1/mpsc_1/producer/1/msg_09223372036854775807"),
                                             NULL, NULL, NULL, &id),
                     FX_OK);
    assert_int_equal(id, INT64_MAX);
    const char *bad[] = {
        "",
        "mpmc/3/mpsc_17/producer/5/msg_0000000000000000042",   /* 19 digits */
        "mpmc/3/mpsc_17/producer/5/msg_000000000000000000042", /* 21 digits */
        "mpmc/3/mpsc_17/producer/5/msg_42",
        "mpmc/3/mpsc_17/producer/5/msg_09223372036854775808", /* > INT64_MAX */
        "mpmc/3/mpsc_17/producer/5/msg_99999999999999999999", /* > UINT64_MAX */
        "mpmc/3/mpsc_17/producer/5/msg_1000000000000000000a",
        "mpmc/3/mpsc_17/producer/5/msg_-0000000000000000001",
        "mpmc/3/mpsc_17/producer/5/msg_ 0000000000000000042",
        "mpmc/03/mpsc_17/producer/5/msg_00000000000000000042",
        "mpmc/3/mpsc_017/producer/5/msg_00000000000000000042",
        "mpmc/3/mpsc_17/producer/05/msg_00000000000000000042",
        "mpmc/3/mpsc_17/producer//msg_00000000000000000042",
        "mpmc/3/mpsc_17/producer/5/msg_00000000000000000042/",
        "/mpmc/3/mpsc_17/producer/5/msg_00000000000000000042",
        "mpmc/3/mpsc_17/consumer/5/msg_00000000000000000042",
        "mpmc/+3/mpsc_17/producer/5/msg_00000000000000000042",
        "mpmc/9223372036854775808/mpsc_17/producer/5/msg_00000000000000000042",
        "mpmc/3/mpsc_17/producer/5/",
        "mpmc/3/mpsc_17/",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        m = c = p = id = -7;
        assert_int_equal(fx_mq_parse_payload_key(S(bad[i]), &m, &c, &p, &id), FX_EPROTO);
        assert_int_equal(m, -7); /* outputs untouched on error */
        assert_int_equal(id, -7);
    }
    /* NUL inside */
    const char nul[] = "mpmc/3/mpsc_17/producer/5/msg_0000000000000000004\0002";
    assert_int_equal(fx_mq_parse_payload_key((fx_slice){nul, sizeof nul - 1}, &m, &c, &p, &id),
                     FX_EPROTO);
    /* NULL data */
    assert_int_equal(fx_mq_parse_payload_key((fx_slice){NULL, 3}, &m, &c, &p, &id), FX_EINVAL);
    assert_int_equal(fx_mq_parse_payload_key((fx_slice){NULL, 0}, &m, &c, &p, &id), FX_EPROTO);

    assert_int_equal(fx_mq_parse_mpsc_payload_key(S("mpscchan_17_producer_5_msg_00000000000000000042"),
                                                  &c, &p, &id),
                     FX_OK);
    assert_int_equal(c, 17);
    assert_int_equal(p, 5);
    assert_int_equal(id, 42);
    assert_int_equal(fx_mq_parse_mpsc_payload_key(S("mpscchan_17_producer_5_msg_42"), &c, &p, &id),
                     FX_EPROTO);
    assert_int_equal(
        fx_mq_parse_mpsc_payload_key(S("mpscchan_17_producer_5_msg_00000000000000000042_"), &c, &p,
                                     &id),
        FX_EPROTO);
}

/* ---- control-plane parsers ---------------------------------------------------------------------- */

static void test_parsers_roundtrip(void **state)
{
    (void)state;
    int64_t ids[] = {0, 1, 7, 10, 17, 100, 4096, 1234567890123LL, INT64_MAX};
    size_t n = sizeof ids / sizeof ids[0];
    const fx_mq_keys *ctx[] = {&K, &KC};
    for (size_t r = 0; r < 2; r++)
        for (size_t i = 0; i < n; i++)
            for (size_t j = 0; j < n; j++) {
                const fx_mq_keys *k = ctx[r];
                int64_t a = ids[i], b = ids[j], x = -1, y = -1;
                fx_mq_key key;
                fx_mq_role role;
                assert_int_equal(fx_mq_key_chan_meta(k, a, &key), FX_OK);
                assert_int_equal(fx_mq_parse_chan_meta_key(k, fx_mq_key_slice(&key), &x), FX_OK);
                assert_int_equal(x, a);
#define RT2(build, parse)                                                                          \
    x = y = -1;                                                                                    \
    assert_int_equal(build(k, a, b, &key), FX_OK);                                                 \
    assert_int_equal(parse(k, fx_mq_key_slice(&key), &x, &y), FX_OK);                              \
    assert_int_equal(x, a);                                                                        \
    assert_int_equal(y, b)
                RT2(fx_mq_key_producer_member, fx_mq_parse_producer_member_key);
                RT2(fx_mq_key_consumer_member, fx_mq_parse_consumer_member_key);
                RT2(fx_mq_key_producer_weight, fx_mq_parse_producer_weight_key);
                RT2(fx_mq_key_produce_offset, fx_mq_parse_produce_offset_key);
                RT2(fx_mq_key_consume_offset, fx_mq_parse_consume_offset_key);
                RT2(fx_mq_key_mpmc_ready, fx_mq_parse_ready_key);
#undef RT2
                assert_int_equal(fx_mq_key_mpmc_meta(k, a, &key), FX_OK);
                assert_int_equal(fx_mq_parse_mpmc_meta_key(k, fx_mq_key_slice(&key), &x), FX_OK);
                assert_int_equal(x, a);
                for (int ro = 0; ro < 2; ro++) {
                    assert_int_equal(fx_mq_key_mpmc_role(k, (fx_mq_role)ro, a, b, &key), FX_OK);
                    assert_int_equal(
                        fx_mq_parse_role_key(k, fx_mq_key_slice(&key), &role, &x, &y), FX_OK);
                    assert_int_equal(role, ro);
                    assert_int_equal(x, a);
                    assert_int_equal(y, b);
                }
                /* payload keys */
                int64_t m = -1, c = -1, p = -1, id = -1;
                assert_int_equal(fx_mq_payload_key(a, b, a, b, &key), FX_OK);
                assert_int_equal(fx_mq_parse_payload_key(fx_mq_key_slice(&key), &m, &c, &p, &id),
                                 FX_OK);
                assert_true(m == a && c == b && p == a && id == b);
                assert_int_equal(fx_mq_mpsc_payload_key(b, a, b, &key), FX_OK);
                assert_int_equal(fx_mq_parse_mpsc_payload_key(fx_mq_key_slice(&key), &c, &p, &id),
                                 FX_OK);
                assert_true(c == b && p == a && id == b);
                /* generic suffix parser over a prefix */
                fx_mq_key pre;
                assert_int_equal(fx_mq_prefix_produce_offsets(k, a, &pre), FX_OK);
                assert_int_equal(fx_mq_key_produce_offset(k, a, b, &key), FX_OK);
                assert_int_equal(
                    fx_mq_parse_id_after(fx_mq_key_slice(&key), fx_mq_key_slice(&pre), &x), FX_OK);
                assert_int_equal(x, b);
            }
}

static void test_parsers_reject(void **state)
{
    (void)state;
    int64_t a = -9, b = -9;
    const char *bad_off[] = {
        "/fluxon/channels/17/producer_offset_of_all_producer/",
        "/fluxon/channels/17/producer_offset_of_all_producer/03",
        "/fluxon/channels/17/producer_offset_of_all_producer/-3",
        "/fluxon/channels/17/producer_offset_of_all_producer/+3",
        "/fluxon/channels/17/producer_offset_of_all_producer/3/",
        "/fluxon/channels/17/producer_offset_of_all_producer/3x",
        "/fluxon/channels/17/producer_offset_of_all_producer/ 3",
        "/fluxon/channels/17/producer_offset_of_all_producer/9223372036854775808",
        "/fluxon/channels/17/producer_offset_of_all_producer/18446744073709551616",
        "/fluxon/channels/17/producer_offset_of_all_producer/99999999999999999999999",
        "/fluxon/channels/017/producer_offset_of_all_producer/3",
        "/fluxon/channels//producer_offset_of_all_producer/3",
        "/fluxon/channels/17/consumer_offset_of_all_producer/3",
        "/fluxon/channels/17/producer_offset_of_all_producers/3",
        "/fluxon/channels/meta/17",
        "/fluxonx/channels/17/producer_offset_of_all_producer/3",
        "/fluxo/channels/17/producer_offset_of_all_producer/3",
        "fluxon/channels/17/producer_offset_of_all_producer/3",
        "/x/y-z/channels/17/producer_offset_of_all_producer/3",
        "/fluxon//channels/17/producer_offset_of_all_producer/3",
        "/fluxon/channels/17/producer_offset_of_all_producer",
        "",
        "/",
    };
    for (size_t i = 0; i < sizeof bad_off / sizeof bad_off[0]; i++) {
        assert_int_equal(fx_mq_parse_produce_offset_key(&K, S(bad_off[i]), &a, &b), FX_EPROTO);
        assert_int_equal(a, -9);
        assert_int_equal(b, -9);
    }
    assert_int_equal(fx_mq_parse_produce_offset_key(
                         &K, S("/fluxon/channels/17/producer_offset_of_all_producer/3"), &a, &b),
                     FX_OK);
    /* the detail points at the problem */
    assert_int_equal(fx_mq_parse_produce_offset_key(
                         &K, S("/fluxon/channels/17/producer_offset_of_all_producer/0x"), &a, &b),
                     FX_EPROTO);
    assert_non_null(strstr(fx_err_detail(), "produce offset"));

    assert_int_equal(fx_mq_parse_producer_member_key(&K, S("/fluxon/channels/1/producer/3"), &a, &b),
                     FX_EPROTO);
    assert_int_equal(
        fx_mq_parse_producer_member_key(&K, S("/fluxon/channels/1/producer/consumer_3"), &a, &b),
        FX_EPROTO);
    assert_int_equal(
        fx_mq_parse_consumer_member_key(&K, S("/fluxon/channels/1/consumer/consumer_"), &a, &b),
        FX_EPROTO);
    assert_int_equal(fx_mq_parse_chan_meta_key(&K, S("/fluxon/channels/meta/"), &a), FX_EPROTO);
    assert_int_equal(fx_mq_parse_chan_meta_key(&K, S("/fluxon/channels/meta/1/"), &a), FX_EPROTO);
    assert_int_equal(fx_mq_parse_mpmc_meta_key(&K, S("/fluxon/mpmc_channels/1/metax"), &a),
                     FX_EPROTO);
    assert_int_equal(fx_mq_parse_ready_key(&K, S("/fluxon/mpmc_channels/ready/1"), &a, &b),
                     FX_EPROTO);
    assert_int_equal(fx_mq_parse_ready_key(&K, S("/fluxon/mpmc_channels/ready/1/"), &a, &b),
                     FX_EPROTO);
    assert_int_equal(fx_mq_parse_ready_key(&K, S("/fluxon/mpmc_channels/ready/1/2/3"), &a, &b),
                     FX_EPROTO);
    assert_int_equal(fx_mq_parse_ready_key(&K, S("/fluxon/mpmc_channels/ready/01/2"), &a, &b),
                     FX_EPROTO);
    fx_mq_role r = FX_MQ_ROLE_CONSUMER;
    assert_int_equal(fx_mq_parse_role_key(&K, S("/fluxon/mpmc_channels/ready/1/2"), &r, &a, &b),
                     FX_EPROTO);
    assert_int_equal(fx_mq_parse_role_key(&K, S("/fluxon/mpmc_channels/producers/1/2"), &r, &a, &b),
                     FX_EPROTO);
    assert_int_equal(fx_mq_parse_role_key(&K, S("/fluxon/mpmc_channels/producer/1"), &r, &a, &b),
                     FX_EPROTO);
    assert_int_equal(r, FX_MQ_ROLE_CONSUMER);
    a = -9;
    assert_int_equal(fx_mq_parse_role_key(&K, S("/fluxon/mpmc_channels/producer/1/2"), NULL, NULL,
                                          NULL),
                     FX_OK);
    assert_int_equal(a, -9);

    /* keys too long for any builder are rejected before scanning */
    char big[FX_MQ_KEY_CAP + 10];
    memset(big, '1', sizeof big);
    memcpy(big, "/fluxon/channels/meta/", 22);
    assert_int_equal(fx_mq_parse_chan_meta_key(&K, (fx_slice){big, sizeof big}, &a), FX_EPROTO);
    assert_int_equal(fx_mq_parse_chan_meta_key(&K, (fx_slice){big, 22 + 19}, &a), FX_OK);
    assert_int_equal(a, 1111111111111111111LL);
    assert_int_equal(fx_mq_parse_chan_meta_key(&K, (fx_slice){big, 22 + 20}, &a), FX_EPROTO);

    /* uninitialised context never matches */
    fx_mq_keys z;
    memset(&z, 0, sizeof z);
    assert_int_equal(fx_mq_parse_chan_meta_key(&z, S("/fluxon/channels/meta/1"), &a), FX_EPROTO);
    assert_int_equal(fx_mq_parse_chan_meta_key(NULL, S("/fluxon/channels/meta/1"), &a), FX_EPROTO);

    /* generic */
    assert_int_equal(fx_mq_parse_id_after(S("/p/12"), S("/p/"), &a), FX_OK);
    assert_int_equal(a, 12);
    assert_int_equal(fx_mq_parse_id_after(S("/p/12"), S("/q/"), &a), FX_EPROTO);
    assert_int_equal(fx_mq_parse_id_after(S("/p/"), S("/p/"), &a), FX_EPROTO);
    assert_int_equal(fx_mq_parse_id_after(S("/p"), S("/p/"), &a), FX_EPROTO);
    assert_int_equal(fx_mq_parse_id_after(S("/p/1/"), S("/p/"), &a), FX_EPROTO);
    assert_int_equal(fx_mq_parse_id_after(S("7"), S(""), &a), FX_OK);
    assert_int_equal(a, 7);
    assert_int_equal(fx_mq_parse_id_after(S("7"), (fx_slice){NULL, 2}, &a), FX_EINVAL);
}

static void test_parse_unique(void **state)
{
    (void)state;
    char name[FX_MQ_NAME_MAX + 1];
    fx_mq_key k;
    assert_int_equal(fx_mq_key_unique(&K, "orders.eu", &k), FX_OK);
    assert_int_equal(fx_mq_parse_unique_key(&K, fx_mq_key_slice(&k), name, sizeof name), FX_OK);
    assert_string_equal(name, "orders.eu");
    assert_int_equal(fx_mq_parse_unique_key(&K, S("/fluxon/mq_unique_keys/"), name, sizeof name),
                     FX_EPROTO);
    assert_int_equal(fx_mq_parse_unique_key(&K, S("/fluxon/mq_unique_keys/a/b"), name, sizeof name),
                     FX_EPROTO);
    assert_int_equal(fx_mq_parse_unique_key(&K, S("/fluxon/mq_unique_locks/a"), name, sizeof name),
                     FX_EPROTO);
    assert_int_equal(fx_mq_parse_unique_key(&K, S("/fluxon/mq_unique_keys/a"), name, 10), FX_EINVAL);
    assert_int_equal(fx_mq_parse_unique_key(&K, S("/fluxon/mq_unique_keys/a"), NULL, 500),
                     FX_EINVAL);
    char big[300];
    int n = snprintf(big, sizeof big, "/fluxon/mq_unique_keys/");
    memset(big + n, 'a', FX_MQ_NAME_MAX + 1);
    assert_int_equal(
        fx_mq_parse_unique_key(&K, (fx_slice){big, (size_t)n + FX_MQ_NAME_MAX + 1}, name, sizeof name),
        FX_EPROTO);
    assert_int_equal(
        fx_mq_parse_unique_key(&K, (fx_slice){big, (size_t)n + FX_MQ_NAME_MAX}, name, sizeof name),
        FX_OK);
    assert_int_equal(strlen(name), FX_MQ_NAME_MAX);
    const char nul[] = "/fluxon/mq_unique_keys/a\0b";
    assert_int_equal(fx_mq_parse_unique_key(&K, (fx_slice){nul, sizeof nul - 1}, name, sizeof name),
                     FX_EPROTO);
}

/* ---- fuzz ------------------------------------------------------------------------------------- */

/* Any key that parses must rebuild to exactly the same bytes (one key per id tuple). */
static int check_canonical(const uint8_t *buf, size_t len)
{
    int ok = 0;
    fx_slice s = {buf, len};
    int64_t a, b, c, d;
    fx_mq_role r;
    fx_mq_key k;
#define CANON(parse_call, build_call)                                                              \
    if ((parse_call) == FX_OK) {                                                                   \
        ok++;                                                                                      \
        assert_int_equal((build_call), FX_OK);                                                     \
        assert_int_equal(k.len, len);                                                              \
        assert_memory_equal(k.s, buf, len);                                                        \
    }
    CANON(fx_mq_parse_chan_meta_key(&K, s, &a), fx_mq_key_chan_meta(&K, a, &k));
    CANON(fx_mq_parse_producer_member_key(&K, s, &a, &b), fx_mq_key_producer_member(&K, a, b, &k));
    CANON(fx_mq_parse_consumer_member_key(&K, s, &a, &b), fx_mq_key_consumer_member(&K, a, b, &k));
    CANON(fx_mq_parse_producer_weight_key(&K, s, &a, &b), fx_mq_key_producer_weight(&K, a, b, &k));
    CANON(fx_mq_parse_produce_offset_key(&K, s, &a, &b), fx_mq_key_produce_offset(&K, a, b, &k));
    CANON(fx_mq_parse_consume_offset_key(&K, s, &a, &b), fx_mq_key_consume_offset(&K, a, b, &k));
    CANON(fx_mq_parse_mpmc_meta_key(&K, s, &a), fx_mq_key_mpmc_meta(&K, a, &k));
    CANON(fx_mq_parse_ready_key(&K, s, &a, &b), fx_mq_key_mpmc_ready(&K, a, b, &k));
    CANON(fx_mq_parse_role_key(&K, s, &r, &a, &b), fx_mq_key_mpmc_role(&K, r, a, b, &k));
    CANON(fx_mq_parse_payload_key(s, &a, &b, &c, &d), fx_mq_payload_key(a, b, c, d, &k));
    CANON(fx_mq_parse_mpsc_payload_key(s, &a, &b, &c), fx_mq_mpsc_payload_key(a, b, c, &k));
#undef CANON
    char name[FX_MQ_NAME_MAX + 1];
    if (fx_mq_parse_unique_key(&K, s, name, sizeof name) == FX_OK) {
        ok++;
        assert_int_equal(fx_mq_key_unique(&K, name, &k), FX_OK);
        assert_int_equal(k.len, len);
        assert_memory_equal(k.s, buf, len);
    }
    return ok;
}

static void test_fuzz(void **state)
{
    (void)state;
    srand(0xF1u);
    /* seeds: valid keys of every kind */
    fx_mq_key seeds[12];
    size_t ns = 0;
    assert_int_equal(fx_mq_key_chan_meta(&K, 17, &seeds[ns++]), FX_OK);
    assert_int_equal(fx_mq_key_producer_member(&K, 17, 3, &seeds[ns++]), FX_OK);
    assert_int_equal(fx_mq_key_consumer_member(&K, 17, 3, &seeds[ns++]), FX_OK);
    assert_int_equal(fx_mq_key_producer_weight(&K, 1, 30, &seeds[ns++]), FX_OK);
    assert_int_equal(fx_mq_key_produce_offset(&K, 1, 2, &seeds[ns++]), FX_OK);
    assert_int_equal(fx_mq_key_consume_offset(&K, 100, 2, &seeds[ns++]), FX_OK);
    assert_int_equal(fx_mq_key_mpmc_meta(&K, 9, &seeds[ns++]), FX_OK);
    assert_int_equal(fx_mq_key_mpmc_ready(&K, 9, 10, &seeds[ns++]), FX_OK);
    assert_int_equal(fx_mq_key_mpmc_role(&K, FX_MQ_ROLE_CONSUMER, 9, 10, &seeds[ns++]), FX_OK);
    assert_int_equal(fx_mq_payload_key(9, 10, 11, 12345, &seeds[ns++]), FX_OK);
    assert_int_equal(fx_mq_mpsc_payload_key(9, 10, 12345, &seeds[ns++]), FX_OK);
    assert_int_equal(fx_mq_key_unique(&K, "orders", &seeds[ns++]), FX_OK);
    const char alphabet[] = "0123456789/_-abcmpsx\xff";
    int accepted = 0;
    for (int it = 0; it < 60000; it++) {
        size_t len;
        uint8_t *buf;
        if (it % 3 == 0) { /* random bytes */
            len = (size_t)(rand() % 80);
            buf = malloc(len ? len : 1);
            for (size_t i = 0; i < len; i++) buf[i] = (uint8_t)rand();
        } else { /* mutated seed */
            const fx_mq_key *sd = &seeds[rand() % (int)ns];
            len = sd->len;
            uint8_t tmp[FX_MQ_KEY_CAP + 8];
            memcpy(tmp, sd->s, len);
            int muts = 1 + rand() % 3;
            for (int m = 0; m < muts; m++) {
                int op = rand() % 5;
                size_t pos = len ? (size_t)rand() % len : 0;
                if (op == 4 && len && tmp[pos] >= '0' && tmp[pos] <= '9') { /* digit swap */
                    tmp[pos] = (uint8_t)('0' + rand() % 10);
                } else if (op == 0 && len) {
                    tmp[pos] = (uint8_t)alphabet[rand() % (int)(sizeof alphabet - 1)];
                } else if (op == 1 && len) { /* delete */
                    memmove(tmp + pos, tmp + pos + 1, len - pos - 1);
                    len--;
                } else if (op == 2 && len < FX_MQ_KEY_CAP) { /* insert */
                    memmove(tmp + pos + 1, tmp + pos, len - pos);
                    tmp[pos] = (uint8_t)alphabet[rand() % (int)(sizeof alphabet - 1)];
                    len++;
                } else if (len) { /* truncate */
                    len = pos;
                }
            }
            buf = malloc(len ? len : 1);
            memcpy(buf, tmp, len);
        }
        accepted += check_canonical(buf, len); /* exact-size heap copy: ASan sees over-reads */
        free(buf);
    }
    assert_true(accepted > 500); /* mutations also reach the success paths */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_root_validation), cmocka_unit_test(test_role_name),
        cmocka_unit_test(test_mpsc_keys),       cmocka_unit_test(test_mpmc_keys),
        cmocka_unit_test(test_global_keys),     cmocka_unit_test(test_names),
        cmocka_unit_test(test_negative_ids),    cmocka_unit_test(test_prefix_relations),
        cmocka_unit_test(test_payload_keys),    cmocka_unit_test(test_parse_payload),
        cmocka_unit_test(test_parsers_roundtrip), cmocka_unit_test(test_parsers_reject),
        cmocka_unit_test(test_parse_unique),    cmocka_unit_test(test_fuzz),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
