/* Unit tests: fluxon-bridge configuration (plugin/config.h): defaults, overrides, durations,
 * every class of error with the field named in the message, overlap rules, DLQ generation, the
 * documented example config and the example files under deploy/ (run with cwd = repo root). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "leaf.h"

#define CH_ORDERS "{\"name\":\"orders\",\"subjects\":[\"orders.>\"],\"deliver_prefix\":\"q.orders\"}"
#define CHANNELS "\"channels\":[" CH_ORDERS "]"

static int parse(const char *json, fx_config *c, char *err, size_t errlen)
{
    return fx_config_parse(json, strlen(json), c, err, errlen);
}

static void parse_ok(const char *json, fx_config *c)
{
    char err[512];
    memset(c, 0, sizeof *c);
    if (parse(json, c, err, sizeof err) != 0) fail_msg("unexpected error: %s\n  for %s", err, json);
}

/* ---- defaults ---------------------------------------------------------------------------- */

static void assert_default_settings(const fx_chan_settings *s)
{
    assert_int_equal(s->ttl_seconds, 90);
    assert_int_equal(s->capacity, 100000);
    assert_int_equal(s->ack, FX_ACK_EXPLICIT);
    assert_int_equal(s->ack_wait_ms, 30000);
    assert_int_equal(s->max_deliver, 5);
    assert_int_equal(s->max_ack_pending, 1000);
    assert_int_equal(s->n_backoff, 2);
    assert_int_equal(s->backoff_ms[0], 1000);
    assert_int_equal(s->backoff_ms[1], 5000);
    assert_int_equal(s->release_after_ms, 5000);
    assert_int_equal(s->interest_poll_ms, 1000);
    assert_int_equal(s->full_wait_ms, 0);
    assert_int_equal(s->nak_delay_ms, 0);
    assert_int_equal(s->duplicate_window_ms, 120000);
    assert_int_equal(s->max_delay_ms, 86400000); /* delayed publishes: 1 d */
}

static void test_defaults(void **state)
{
    (void)state;
    fx_config c;
    parse_ok("{" CHANNELS "}", &c);
    assert_string_equal(c.nats.url, "nats://127.0.0.1:4222");
    assert_string_equal(c.nats.monitor_url, "http://127.0.0.1:8222");
    assert_string_equal(c.nats.account, "$G");
    assert_null(c.nats.user);
    assert_null(c.nats.password);
    assert_null(c.nats.token);
    assert_null(c.nats.creds_file);
    assert_null(c.nats.nkey_seed_file);
    assert_null(c.nats.ca_file);
    assert_false(c.nats.tls_insecure);
    assert_int_equal(c.etcd.n_endpoints, 1);
    assert_string_equal(c.etcd.endpoints[0], "http://127.0.0.1:2379");
    assert_string_equal(c.etcd.prefix, "/fluxon");
    assert_null(c.etcd.username);
    assert_false(c.etcd.tls_insecure);
    assert_string_equal(c.kv.backend, "etcd");
    assert_string_equal(c.etcd.transport, "grpc");
    assert_int_equal(c.kv.n_endpoints, 1);
    assert_string_equal(c.kv.endpoints[0], "http://127.0.0.1:2379");
    assert_null(c.http.listen);
    assert_default_settings(&c.defaults);

    /* name: "<host>-<pid>", sanitised, at most 64 bytes, a single token */
    char suffix[32];
    snprintf(suffix, sizeof suffix, "-%ld", (long)getpid());
    size_t n = strlen(c.name), sl = strlen(suffix);
    assert_true(n > sl && n <= 64);
    assert_string_equal(c.name + n - sl, suffix);
    for (size_t i = 0; i < n; i++)
        assert_non_null(strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-",
                               c.name[i]));

    assert_int_equal(c.n_channels, 2);
    assert_string_equal(c.channels[0].name, "orders");
    assert_int_equal(c.channels[0].n_subjects, 1);
    assert_string_equal(c.channels[0].subjects[0], "orders.>");
    assert_string_equal(c.channels[0].deliver_prefix, "q.orders");
    assert_false(c.channels[0].is_dlq);
    assert_default_settings(&c.channels[0].s);
    fx_config_free(&c);
    fx_config_free(&c); /* zeroed: a second free is harmless */
    fx_config_free(NULL);
}

/* ---- overrides --------------------------------------------------------------------------- */

static void test_overrides(void **state)
{
    (void)state;
    fx_config c;
    /* "defaults" after "channels": still applies to them. */
    parse_ok("{\"channels\":["
             "{\"name\":\"orders\",\"subjects\":[\"orders.>\"],\"deliver_prefix\":\"q.orders\","
             " \"ttl_seconds\":30,\"ack\":\"none\",\"backoff\":[]},"
             "{\"name\":\"jobs\",\"subjects\":[\"jobs.*\",\"work.>\"],\"deliver_prefix\":\"q.jobs\","
             " \"max_deliver\":2,\"ack_wait\":\"250ms\",\"interest_poll\":0.05}],"
             "\"defaults\":{\"ttl_seconds\":60,\"capacity\":7,\"ack_wait\":\"1m\","
             " \"max_deliver\":9,\"max_ack_pending\":3,\"backoff\":[\"100ms\",2,\"1m\"],"
             " \"release_after\":\"0s\",\"interest_poll\":\"2s\"}}",
             &c);
    assert_int_equal(c.defaults.ttl_seconds, 60);
    assert_int_equal(c.defaults.capacity, 7);
    assert_int_equal(c.defaults.ack_wait_ms, 60000);
    assert_int_equal(c.defaults.release_after_ms, 0);

    const fx_chan_config *o = fx_config_channel(&c, "orders");
    assert_non_null(o);
    assert_int_equal(o->s.ttl_seconds, 30);   /* own override */
    assert_int_equal(o->s.capacity, 7);       /* from defaults */
    assert_int_equal(o->s.ack, FX_ACK_NONE);
    assert_int_equal(o->s.ack_wait_ms, 60000);
    assert_int_equal(o->s.max_deliver, 9);
    assert_int_equal(o->s.max_ack_pending, 3);
    assert_int_equal(o->s.n_backoff, 0);      /* empty list overrides */
    assert_int_equal(o->s.interest_poll_ms, 2000);

    const fx_chan_config *j = fx_config_channel(&c, "jobs");
    assert_non_null(j);
    assert_int_equal(j->s.ttl_seconds, 60);
    assert_int_equal(j->s.max_deliver, 2);
    assert_int_equal(j->s.ack_wait_ms, 250);
    assert_int_equal(j->s.interest_poll_ms, 50);
    assert_int_equal(j->s.n_backoff, 3);
    assert_int_equal(j->s.backoff_ms[0], 100);
    assert_int_equal(j->s.backoff_ms[1], 2000);
    assert_int_equal(j->s.backoff_ms[2], 60000);
    assert_int_equal(j->n_subjects, 2);
    assert_string_equal(j->subjects[1], "work.>");

    /* orders is ack none: only jobs gets a DLQ */
    assert_int_equal(c.n_channels, 3);
    assert_null(fx_config_channel(&c, "orders-dlq"));
    assert_non_null(fx_config_channel(&c, "jobs-dlq"));
    fx_config_free(&c);
}

static void test_wildcard_subjects_accepted(void **state)
{
    (void)state;
    fx_config c;
    parse_ok("{\"channels\":[{\"name\":\"a\",\"subjects\":[\"*.new\",\"*.eu.>\",\"orders\"],"
             "\"deliver_prefix\":\"q.a\"},"
             "{\"name\":\"b\",\"subjects\":[\"orders.us\",\"*.old\"],\"deliver_prefix\":\"deliver.b\"}]}",
             &c);
    assert_int_equal(c.n_channels, 4);
    assert_int_equal(c.channels[0].n_subjects, 3);
    assert_string_equal(c.channels[0].subjects[1], "*.eu.>");
    fx_config_free(&c);
}

static void test_all_connection_options(void **state)
{
    (void)state;
    fx_config c;
    parse_ok("{\"name\":\"b1\","
             "\"nats\":{\"url\":\"tls://n1:4222,tls://n2:4222\",\"monitor_url\":\"https://n1:8222/\","
             " \"account\":\"APP\",\"user\":\"u\",\"password\":\"p\",\"ca_file\":\"/ca\","
             " \"cert_file\":\"/c\",\"key_file\":\"/k\",\"tls_insecure\":true,\"token\":\"\","
             " \"creds_file\":\"\",\"nkey_seed_file\":\"\"},"
             "\"etcd\":{\"endpoints\":[\"https://e1:2379/\",\"https://e2:2379\"],\"prefix\":\"/a/b\","
             " \"username\":\"root\",\"password\":\"pw\",\"ca_file\":\"/eca\",\"cert_file\":\"/ec\","
             " \"key_file\":\"/ek\",\"tls_insecure\":false},"
             "\"http\":{\"listen\":\"\"}," CHANNELS "}",
             &c);
    assert_string_equal(c.name, "b1");
    assert_string_equal(c.nats.url, "tls://n1:4222,tls://n2:4222");
    assert_string_equal(c.nats.monitor_url, "https://n1:8222"); /* trailing '/' dropped */
    assert_string_equal(c.nats.account, "APP");
    assert_string_equal(c.nats.user, "u");
    assert_string_equal(c.nats.password, "p");
    assert_null(c.nats.token); /* "" = not set */
    assert_null(c.nats.creds_file);
    assert_string_equal(c.nats.key_file, "/k");
    assert_true(c.nats.tls_insecure);
    assert_int_equal(c.etcd.n_endpoints, 2);
    assert_string_equal(c.etcd.endpoints[0], "https://e1:2379");
    assert_string_equal(c.etcd.prefix, "/a/b");
    assert_string_equal(c.etcd.password, "pw");
    assert_string_equal(c.etcd.key_file, "/ek");
    /* kv endpoints default to the etcd endpoints */
    assert_int_equal(c.kv.n_endpoints, 2);
    assert_string_equal(c.kv.endpoints[0], "https://e1:2379");
    assert_string_equal(c.kv.endpoints[1], "https://e2:2379");
    assert_null(c.http.listen); /* "" disables HTTP */
    fx_config_free(&c);

    parse_ok("{\"nats\":{\"creds_file\":\"/x.creds\"},\"kv\":{\"endpoints\":[\"http://kv:2379\"]},"
             "\"http\":{\"listen\":\"[::1]:9090\"}," CHANNELS "}",
             &c);
    assert_string_equal(c.nats.creds_file, "/x.creds");
    assert_string_equal(c.kv.endpoints[0], "http://kv:2379");
    assert_string_equal(c.etcd.endpoints[0], "http://127.0.0.1:2379");
    assert_string_equal(c.http.listen, "[::1]:9090");
    fx_config_free(&c);

    parse_ok("{\"http\":{\"listen\":\":8080\"}," CHANNELS "}", &c);
    assert_string_equal(c.http.listen, ":8080");
    fx_config_free(&c);
}

/* ---- durations --------------------------------------------------------------------------- */

static void test_duration_strings(void **state)
{
    (void)state;
    static const struct { const char *s; int64_t ms; } good[] = {
        {"250ms", 250}, {"30s", 30000}, {"5m", 300000}, {"1h", 3600000}, {"0", 0}, {"0s", 0},
        {"2", 2000}, {"1.5", 1500}, {"1.5s", 1500}, {"0.25h", 900000}, {"0.001", 1},
        {"1.5ms", 2}, {"007s", 7000}, {"0.0004", 0}, {"1.123456789123s", 1123},
        {"2562047788015h", 2562047788015LL * 3600000}, {"1d", 86400000}, {"7d", 7 * 86400000LL},
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        int64_t ms = -7;
        if (fx_parse_duration_ms(good[i].s, &ms) != 0 || ms != good[i].ms)
            fail_msg("\"%s\": got %lld", good[i].s, (long long)ms);
    }
    static const char *const bad[] = {
        "", "s", "ms", "-1s", "+1s", " 1s", "1s ", "1 s", "1sec", "1D", "1us", "1S", "1.", ".5",
        "1e3", "0x10", "1.5.5", "1..5", "inf", "nan", "2562047788016h", "99999999999999999999",
        "9223372036854775807s", "1h30m",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int64_t ms = -7;
        if (fx_parse_duration_ms(bad[i], &ms) == 0) fail_msg("\"%s\" accepted as %lld", bad[i],
                                                             (long long)ms);
        assert_int_equal(ms, -7);
    }
    int64_t ms;
    assert_int_equal(fx_parse_duration_ms(NULL, &ms), -1);
    assert_int_equal(fx_parse_duration_ms("1s", NULL), -1);
}

static void test_duration_json_forms(void **state)
{
    (void)state;
    fx_config c;
    parse_ok("{\"defaults\":{\"ack_wait\":30,\"release_after\":0.25,\"interest_poll\":\"1.5\","
             "\"backoff\":[0, 0.1, \"1h\"],\"full_wait\":\"250ms\",\"duplicate_window\":\"0s\","
             "\"nak_delay\":\"2s\",\"max_delay\":\"7d\"}," CHANNELS "}",
             &c);
    assert_int_equal(c.defaults.max_delay_ms, 7LL * 86400000);
    assert_int_equal(c.defaults.full_wait_ms, 250);
    assert_int_equal(c.defaults.nak_delay_ms, 2000);
    assert_int_equal(c.defaults.duplicate_window_ms, 0);
    assert_int_equal(c.defaults.ack_wait_ms, 30000);
    assert_int_equal(c.defaults.release_after_ms, 250);
    assert_int_equal(c.defaults.interest_poll_ms, 1500);
    assert_int_equal(c.defaults.n_backoff, 3);
    assert_int_equal(c.defaults.backoff_ms[0], 0);
    assert_int_equal(c.defaults.backoff_ms[1], 100);
    assert_int_equal(c.defaults.backoff_ms[2], 3600000);
    fx_config_free(&c);
}

/* ---- errors: each class, with the field in the message ------------------------------------ */

typedef struct {
    const char *json;
    const char *want; /* substring of the error */
} err_case;

static void run_err_cases(const err_case *cases, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        char err[512];
        fx_config c;
        memset(&c, 0xA5, sizeof c); /* failure must leave *out untouched */
        fx_config before;
        memcpy(&before, &c, sizeof c);
        int rc = parse(cases[i].json, &c, err, sizeof err);
        if (rc == 0) {
            fx_config_free(&c);
            fail_msg("case %zu accepted: %s", i, cases[i].json);
        }
        assert_int_equal(rc, -1);
        if (!strstr(err, cases[i].want))
            fail_msg("case %zu: error \"%s\" does not contain \"%s\"\n  for %s", i, err,
                     cases[i].want, cases[i].json);
        assert_memory_equal(&c, &before, sizeof c);
    }
}
#define RUN(cases) run_err_cases(cases, sizeof cases / sizeof cases[0])

static void test_err_syntax(void **state)
{
    (void)state;
    static const err_case cases[] = {
        {"", "invalid JSON at line 1, column 1"},
        {"{\n  \"name\": \n}", "invalid JSON at line 3, column 1"},
        {"{\"name\":\"a\"", "invalid JSON"},
        {"{" CHANNELS "} x", "invalid JSON at line 1, column"},
        {"{" CHANNELS "}{}", "invalid JSON"},
        {"[]", "the configuration must be a JSON object"},
        {"\"x\"", "the configuration must be a JSON object"},
        {"{}", "channels: at least one channel is required"},
    };
    RUN(cases);

    char err[256];
    fx_config c;
    const char nul[] = "{\"name\":\"a\0\"}";
    assert_int_equal(fx_config_parse(nul, sizeof nul - 1, &c, err, sizeof err), -1);
    assert_non_null(strstr(err, "NUL byte"));

    /* bounded input: 1 MiB + 1 byte is refused before parsing */
    size_t big = 1024 * 1024 + 1;
    char *buf = malloc(big);
    assert_non_null(buf);
    memset(buf, ' ', big);
    buf[0] = '{';
    buf[big - 1] = '}';
    assert_int_equal(fx_config_parse(buf, big, &c, err, sizeof err), -1);
    assert_non_null(strstr(err, "larger than 1048576 bytes"));
    free(buf);

    /* no err buffer: still fails cleanly */
    assert_int_equal(fx_config_parse("[]", 2, &c, NULL, 0), -1);
    assert_int_equal(fx_config_parse(NULL, 0, &c, err, sizeof err), -1);
    /* a tiny err buffer is truncated, not overrun */
    char tiny[8];
    assert_int_equal(parse("{\"acks\":1}", &c, tiny, sizeof tiny), -1);
    assert_int_equal(strlen(tiny), 7);
}

static void test_err_unknown_and_duplicate_keys(void **state)
{
    (void)state;
    static const err_case cases[] = {
        {"{\"acks\":1," CHANNELS "}", "acks: unknown key"},
        {"{\"Name\":\"x\"," CHANNELS "}", "Name: unknown key"},
        {"{\"nats\":{\"uri\":\"nats://x\"}," CHANNELS "}", "nats.uri: unknown key"},
        {"{\"etcd\":{\"endpoint\":[]}," CHANNELS "}", "etcd.endpoint: unknown key"},
        {"{\"kv\":{\"prefix\":\"/x\"}," CHANNELS "}", "kv.prefix: unknown key"},
        {"{\"http\":{\"port\":80}," CHANNELS "}", "http.port: unknown key"},
        {"{\"defaults\":{\"ackwait\":\"1s\"}," CHANNELS "}", "defaults.ackwait: unknown key"},
        {"{\"defaults\":{\"name\":\"x\"}," CHANNELS "}", "defaults.name: unknown key"},
        {"{\"channels\":[{\"name\":\"orders\",\"subjects\":[\"orders.>\"],\"deliver_prefix\":\"q.o\","
         "\"acks\":\"none\"}]}",
         "channels[0].acks: unknown key"},
        {"{\"channels\":[" CH_ORDERS ",{\"name\":\"b\",\"subjects\":[\"b\"],\"deliver_prefix\":\"q.b\","
         "\"x\":{}}]}",
         "channels[1].x: unknown key"},
        {"{\"bad\\u0001key\":1}", "bad?key: unknown key"},
        {"{\"name\":\"a\",\"name\":\"b\"," CHANNELS "}", "name: duplicate key"},
        {"{\"nats\":{\"url\":\"nats://a:1\",\"url\":\"nats://b:1\"}," CHANNELS "}",
         "nats.url: duplicate key"},
        {"{\"defaults\":{\"capacity\":1,\"capacity\":2}," CHANNELS "}",
         "defaults.capacity: duplicate key"},
        {"{\"channels\":[{\"name\":\"a\",\"name\":\"b\",\"subjects\":[\"a\"],\"deliver_prefix\":\"q\"}]}",
         "channels[0].name: duplicate key"},
        {"{" CHANNELS "," CHANNELS "}", "channels: duplicate key"},
    };
    RUN(cases);
}

static void test_err_types(void **state)
{
    (void)state;
    static const err_case cases[] = {
        {"{\"name\":1," CHANNELS "}", "name: must be a string"},
        {"{\"name\":null," CHANNELS "}", "name: must be a string"},
        {"{\"nats\":[]," CHANNELS "}", "nats: must be an object"},
        {"{\"nats\":{\"url\":5}," CHANNELS "}", "nats.url: must be a string"},
        {"{\"nats\":{\"password\":false}," CHANNELS "}", "nats.password: must be a string"},
        {"{\"nats\":{\"tls_insecure\":\"yes\"}," CHANNELS "}",
         "nats.tls_insecure: must be true or false"},
        {"{\"etcd\":\"http://x\"," CHANNELS "}", "etcd: must be an object"},
        {"{\"etcd\":{\"endpoints\":\"http://x:1\"}," CHANNELS "}",
         "etcd.endpoints: must be an array of strings"},
        {"{\"etcd\":{\"endpoints\":[\"http://x:1\",2]}," CHANNELS "}",
         "etcd.endpoints[1]: must be a string"},
        {"{\"etcd\":{\"endpoints\":[]}," CHANNELS "}", "etcd.endpoints: must not be empty"},
        {"{\"etcd\":{\"tls_insecure\":1}," CHANNELS "}", "etcd.tls_insecure: must be true or false"},
        {"{\"kv\":{\"endpoints\":[\"\"]}," CHANNELS "}", "kv.endpoints[0]: must not be empty"},
        {"{\"http\":{\"listen\":8080}," CHANNELS "}", "http.listen: must be a string"},
        {"{\"defaults\":[]," CHANNELS "}", "defaults: must be an object"},
        {"{\"defaults\":{\"capacity\":\"10\"}," CHANNELS "}", "defaults.capacity: must be an integer"},
        {"{\"defaults\":{\"capacity\":1.5}," CHANNELS "}", "defaults.capacity: must be an integer"},
        {"{\"defaults\":{\"ack\":true}," CHANNELS "}", "defaults.ack: must be \"explicit\" or \"none\""},
        {"{\"defaults\":{\"ack_wait\":true}," CHANNELS "}", "defaults.ack_wait: must be a duration"},
        {"{\"defaults\":{\"backoff\":\"1s\"}," CHANNELS "}",
         "defaults.backoff: must be an array of durations"},
        {"{\"channels\":{}}", "channels: must be an array of objects"},
        {"{\"channels\":[]}", "channels: at least one channel is required"},
        {"{\"channels\":[1]}", "channels[0]: must be an object"},
        {"{\"channels\":[{\"name\":1,\"subjects\":[\"a\"],\"deliver_prefix\":\"q\"}]}",
         "channels[0].name: must be a string"},
        {"{\"channels\":[{\"name\":\"a\",\"subjects\":\"a\",\"deliver_prefix\":\"q\"}]}",
         "channels[0].subjects: must be an array of strings"},
        {"{\"channels\":[{\"name\":\"a\",\"subjects\":[\"a\",null],\"deliver_prefix\":\"q\"}]}",
         "channels[0].subjects[1]: must be a string"},
        {"{\"channels\":[{\"name\":\"a\",\"subjects\":[\"a\"],\"deliver_prefix\":[\"q\"]}]}",
         "channels[0].deliver_prefix: must be a string"},
        {"{\"channels\":[{\"name\":\"a\",\"subjects\":[\"a\"],\"deliver_prefix\":\"q\","
         "\"max_deliver\":\"3\"}]}",
         "channels[0].max_deliver: must be an integer"},
    };
    RUN(cases);
}

static void test_err_ranges_and_durations(void **state)
{
    (void)state;
    static const err_case cases[] = {
        {"{\"defaults\":{\"ttl_seconds\":1}," CHANNELS "}",
         "defaults.ttl_seconds: 1 out of range [2, 9000000000]"},
        {"{\"defaults\":{\"ttl_seconds\":1e300}," CHANNELS "}", "defaults.ttl_seconds: 1e+300 out of range [2, 9000000000]"},
        {"{\"defaults\":{\"capacity\":0}," CHANNELS "}", "defaults.capacity: 0 out of range [1, "},
        {"{\"defaults\":{\"capacity\":-5}," CHANNELS "}", "defaults.capacity: -5 out of range"},
        {"{\"defaults\":{\"max_ack_pending\":1000001}," CHANNELS "}",
         "defaults.max_ack_pending: 1000001 out of range [1, 1000000]"},
        {"{\"defaults\":{\"ack\":\"all\"}," CHANNELS "}", "defaults.ack: must be \"explicit\" or \"none\""},
        {"{\"defaults\":{\"ack_wait\":\"50ms\"}," CHANNELS "}",
         "defaults.ack_wait: 50ms out of range [100ms, 24h]"},
        {"{\"defaults\":{\"ack_wait\":\"25h\"}," CHANNELS "}", "defaults.ack_wait: 25h out of range"},
        {"{\"defaults\":{\"ack_wait\":\"30 s\"}," CHANNELS "}",
         "defaults.ack_wait: \"30 s\" is not a duration (use \"250ms\", \"30s\", \"5m\", \"1h\""},
        {"{\"defaults\":{\"ack_wait\":\"-1s\"}," CHANNELS "}", "defaults.ack_wait: \"-1s\" is not a duration"},
        {"{\"defaults\":{\"ack_wait\":-1}," CHANNELS "}", "defaults.ack_wait: must not be negative"},
        {"{\"defaults\":{\"ack_wait\":1e20}," CHANNELS "}", "defaults.ack_wait: 1e+20 seconds out of range"},
        {"{\"defaults\":{\"ack_wait\":0.05}," CHANNELS "}", "defaults.ack_wait: 50ms out of range"},
        {"{\"defaults\":{\"interest_poll\":\"10ms\"}," CHANNELS "}",
         "defaults.interest_poll: 10ms out of range [50ms, 1h]"},
        {"{\"defaults\":{\"full_wait\":\"2m\"}," CHANNELS "}",
         "defaults.full_wait: 2m out of range [0ms, 1m]"},
        {"{\"defaults\":{\"nak_delay\":\"2d\"}," CHANNELS "}",
         "defaults.nak_delay: 48h out of range [0ms, 24h]"},
        {"{\"defaults\":{\"nak_delay\":-1}," CHANNELS "}", "defaults.nak_delay: must not be negative"},
        {"{\"defaults\":{\"max_delay\":\"soon\"}," CHANNELS "}",
         "defaults.max_delay: \"soon\" is not a duration"},
        {"{\"defaults\":{\"release_after\":\"2w\"}," CHANNELS "}",
         "defaults.release_after: \"2w\" is not a duration"},
        {"{\"defaults\":{\"retention\":\"1s\"}," CHANNELS "}",
         "defaults.retention: 1s out of range [2s, "},
        {"{\"defaults\":{\"ttl_seconds\":10,\"retention\":\"5s\"}," CHANNELS "}",
         "channels[0].retention: 5000 ms is shorter than ttl_seconds (10 s)"},
        {"{\"defaults\":{\"backoff\":[\"1s\",\"x\"]}," CHANNELS "}",
         "defaults.backoff[1]: \"x\" is not a duration"},
        {"{\"defaults\":{\"backoff\":[\"1s\",-2]}," CHANNELS "}", "defaults.backoff[1]: must not be negative"},
        {"{\"defaults\":{\"backoff\":[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1]}," CHANNELS "}",
         "defaults.backoff: at most 16 entries"},
        {"{\"channels\":[{\"name\":\"a\",\"subjects\":[\"a\"],\"deliver_prefix\":\"q\",\"max_deliver\":0}]}",
         "channels[0].max_deliver: 0 out of range [1, 1000000]"},
        {"{\"channels\":[{\"name\":\"a\",\"subjects\":[\"a\"],\"deliver_prefix\":\"q\","
         "\"backoff\":[\"1s\",\"2days\"]}]}",
         "channels[0].backoff[1]: \"2days\" is not a duration"},
        {"{\"channels\":[{\"name\":\"a\",\"subjects\":[\"a\"],\"deliver_prefix\":\"q\",\"ack\":\"NONE\"}]}",
         "channels[0].ack: must be \"explicit\" or \"none\""},
    };
    RUN(cases);
}

static void test_err_connection_values(void **state)
{
    (void)state;
    static const err_case cases[] = {
        {"{\"nats\":{\"url\":\"http://x:4222\"}," CHANNELS "}", "nats.url: must be a nats:// or tls:// URL"},
        {"{\"nats\":{\"url\":\"nats://\"}," CHANNELS "}", "nats.url: must be a nats:// or tls:// URL"},
        {"{\"nats\":{\"url\":\"127.0.0.1:4222\"}," CHANNELS "}", "nats.url: must be"},
        {"{\"nats\":{\"url\":\"nats://a:1,\"}," CHANNELS "}", "nats.url: must be"},
        {"{\"nats\":{\"url\":\"nats://a b\"}," CHANNELS "}", "nats.url: must be"},
        {"{\"nats\":{\"url\":\"\"}," CHANNELS "}", "nats.url: must not be empty"},
        {"{\"nats\":{\"monitor_url\":\"nats://x:8222\"}," CHANNELS "}",
         "nats.monitor_url: must be an http:// or https:// URL"},
        {"{\"nats\":{\"account\":\"A B\"}," CHANNELS "}", "nats.account: must be a name"},
        {"{\"nats\":{\"account\":\"\"}," CHANNELS "}", "nats.account: must not be empty"},
        {"{\"nats\":{\"password\":\"p\"}," CHANNELS "}", "nats.password: requires nats.user"},
        {"{\"nats\":{\"user\":\"u\",\"token\":\"t\"}," CHANNELS "}",
         "nats: set only one of user, token, creds_file, nkey_seed_file"},
        {"{\"nats\":{\"creds_file\":\"/a\",\"nkey_seed_file\":\"/b\"}," CHANNELS "}", "nats: set only one"},
        {"{\"nats\":{\"cert_file\":\"/c\"}," CHANNELS "}", "nats.key_file: cert_file and key_file go together"},
        {"{\"nats\":{\"key_file\":\"/k\"}," CHANNELS "}", "nats.cert_file: cert_file and key_file go together"},
        {"{\"etcd\":{\"endpoints\":[\"127.0.0.1:2379\"]}," CHANNELS "}",
         "etcd.endpoints[0]: must be an http:// or https:// URL"},
        {"{\"etcd\":{\"endpoints\":[\"http://ok:1\",\"grpc://x:2379\"]}," CHANNELS "}",
         "etcd.endpoints[1]: must be an http"},
        {"{\"etcd\":{\"endpoints\":[\"http://:2379\"]}," CHANNELS "}", "etcd.endpoints[0]: must be an http"},
        {"{\"etcd\":{\"prefix\":\"fluxon\"}," CHANNELS "}", "etcd.prefix: must start with '/'"},
        {"{\"etcd\":{\"prefix\":\"/fluxon/\"}," CHANNELS "}", "etcd.prefix: must start with '/', not end"},
        {"{\"etcd\":{\"prefix\":\"/a//b\"}," CHANNELS "}", "etcd.prefix: must"},
        {"{\"etcd\":{\"prefix\":\"/\"}," CHANNELS "}", "etcd.prefix: must"},
        {"{\"etcd\":{\"prefix\":\"/a b\"}," CHANNELS "}", "etcd.prefix: must"},
        {"{\"etcd\":{\"username\":\"root\"}," CHANNELS "}", "etcd.password: username and password go together"},
        {"{\"etcd\":{\"password\":\"pw\"}," CHANNELS "}", "etcd.username: username and password go together"},
        {"{\"etcd\":{\"cert_file\":\"/c\"}," CHANNELS "}", "etcd.key_file: cert_file and key_file go together"},
        {"{\"kv\":{\"backend\":\"mem\"}," CHANNELS "}", "kv.backend: \"mem\" is not supported (\"etcd\" or \"redis\")"},
        {"{\"etcd\":{\"transport\":\"http2\"}," CHANNELS "}", "etcd.transport: \"http2\" is not supported (\"grpc\" or \"json\")"},
        {"{\"kv\":{\"backend\":\"redis\"}," CHANNELS "}", "kv.url: required with kv.backend \"redis\""},
        {"{\"kv\":{\"backend\":\"redis\",\"url\":\"rediss://h:1\"}," CHANNELS "}", "kv.url: must start with redis:// or unix:"},
        {"{\"kv\":{\"backend\":\"redis\",\"url\":\"redis://h:1\",\"endpoints\":[\"http://x:1\"]}," CHANNELS "}", "kv.endpoints: only with kv.backend \"etcd\""},
        {"{\"kv\":{\"url\":\"redis://h:1\"}," CHANNELS "}", "kv.url: only with kv.backend \"redis\""},
        {"{\"kv\":{\"require_fsync\":true}," CHANNELS "}", "kv.require_fsync: only with kv.backend \"redis\""},
        {"{\"kv\":{\"min_replicas\":1}," CHANNELS "}", "kv.min_replicas: only with kv.backend \"redis\""},
        {"{\"kv\":{\"backend\":\"redis\",\"url\":\"redis://h:1\",\"min_replicas\":17}," CHANNELS "}", "kv.min_replicas: 17 out of range"},
        {"{\"kv\":{\"backend\":\"redis\",\"url\":\"redis://h:1\",\"timeout_ms\":5}," CHANNELS "}", "kv.timeout_ms: 5 out of range"},
        {"{\"kv\":{\"backend\":\"\"}," CHANNELS "}", "kv.backend: must not be empty"},
        {"{\"kv\":{\"endpoints\":[\"ftp://x\"]}," CHANNELS "}", "kv.endpoints[0]: must be an http"},
        {"{\"http\":{\"listen\":\"8080\"}," CHANNELS "}", "http.listen: must be host:port"},
        {"{\"http\":{\"listen\":\"127.0.0.1:0\"}," CHANNELS "}", "http.listen: port must be 1..65535"},
        {"{\"http\":{\"listen\":\"127.0.0.1:65536\"}," CHANNELS "}", "http.listen: port must be 1..65535"},
        {"{\"http\":{\"listen\":\"127.0.0.1:80x\"}," CHANNELS "}", "http.listen: port must be 1..65535"},
        {"{\"http\":{\"listen\":\"127.0.0.1:\"}," CHANNELS "}", "http.listen: port must be 1..65535"},
        {"{\"http\":{\"listen\":\"::1:8080\"}," CHANNELS "}", "http.listen: IPv6 addresses need brackets"},
        {"{\"http\":{\"listen\":\"[::1]\"}," CHANNELS "}", "http.listen: must be host:port"},
        {"{\"http\":{\"listen\":\"[::1]x:80\"}," CHANNELS "}", "http.listen: must be host:port"},
        {"{\"http\":{\"listen\":\"h ost:80\"}," CHANNELS "}", "http.listen: must be host:port"},
    };
    RUN(cases);
}

static void test_err_names(void **state)
{
    (void)state;
    static const err_case cases[] = {
        {"{\"name\":\"\"," CHANNELS "}", "name: must not be empty"},
        {"{\"name\":\"a.b\"," CHANNELS "}", "name: \"a.b\" is not a single subject token"},
        {"{\"name\":\"a*\"," CHANNELS "}", "name: \"a*\" is not a single subject token"},
        {"{\"name\":\"a b\"," CHANNELS "}", "name: \"a b\" is not a single subject token"},
        {"{\"name\":\"a/b\"," CHANNELS "}", "name: \"a/b\" is not a single subject token"},
        {"{\"name\":\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"," CHANNELS "}",
         "name: longer than 64 bytes"},
        {"{\"channels\":[{\"subjects\":[\"a\"],\"deliver_prefix\":\"q\"}]}", "channels[0].name: required"},
        {"{\"channels\":[{\"name\":\"\",\"subjects\":[\"a\"],\"deliver_prefix\":\"q\"}]}",
         "channels[0].name: must not be empty"},
        {"{\"channels\":[{\"name\":\"or.ders\",\"subjects\":[\"a\"],\"deliver_prefix\":\"q\"}]}",
         "channels[0].name: \"or.ders\" is not a single subject token"},
        {"{\"channels\":[{\"name\":\">\",\"subjects\":[\"a\"],\"deliver_prefix\":\"q\"}]}",
         "channels[0].name: \">\" is not a single subject token"},
        {"{\"channels\":[{\"name\":\"a\\\\b\",\"subjects\":[\"a\"],\"deliver_prefix\":\"q\"}]}",
         "channels[0].name: \"a\\b\" is not a single subject token"},
        {"{\"channels\":[{\"name\":\"orders-dlq\",\"subjects\":[\"a\"],\"deliver_prefix\":\"q\"}]}",
         "channels[0].name: \"orders-dlq\": names ending in \"-dlq\" are reserved"},
        {"{\"channels\":[{\"name\":\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\","
         "\"subjects\":[\"a\"],\"deliver_prefix\":\"q\"}]}",
         "channels[0].name: longer than 64 bytes"},
        {"{\"channels\":[" CH_ORDERS ",{\"name\":\"orders\",\"subjects\":[\"b\"],\"deliver_prefix\":\"q.b\"}]}",
         "channels[1].name: \"orders\" is also the name of channels[0]"},
    };
    RUN(cases);
}

/* Control characters in names and subjects are refused; a \u0000 escape anywhere in a string is
 * refused before cJSON would end the C string there (a silent truncation of "or\u0000ders" to
 * "or"). */
static void test_control_characters_refused(void **state)
{
    (void)state;
    static const err_case cases[] = {
        {"{\"name\":\"br\\u0000idge\"," CHANNELS "}", "line 1, column 12: \\u0000 (NUL) in a string"},
        {"{\"channels\":[{\"name\":\"or\\u0000ders\",\"subjects\":[\"a\"],\"deliver_prefix\":\"q\"}]}",
         "\\u0000 (NUL) in a string"},
        {"{\"channels\":[{\"name\":\"o\",\"subjects\":[\"a.\\u0000\"],\"deliver_prefix\":\"q\"}]}",
         "\\u0000 (NUL) in a string"},
        {"{\"channels\":[{\"name\":\"o\",\"subjects\":[\"a\"],\"deliver_prefix\":\"q\\u0000x\"}]}",
         "\\u0000 (NUL) in a string"},
        {"{\"etcd\":{\"password\":\"\\u0000\"}," CHANNELS "}", "\\u0000 (NUL) in a string"},
        {"{\"name\":\"a\\u0001\"," CHANNELS "}", "name: "},
        {"{\"channels\":[{\"name\":\"or\\u001fders\",\"subjects\":[\"a\"],\"deliver_prefix\":\"q\"}]}",
         "channels[0].name: "},
        {"{\"channels\":[{\"name\":\"or\\u007fders\",\"subjects\":[\"a\"],\"deliver_prefix\":\"q\"}]}",
         "channels[0].name: "},
        {"{\"channels\":[{\"name\":\"o\",\"subjects\":[\"a.\\u0007\"],\"deliver_prefix\":\"q\"}]}",
         "channels[0].subjects[0]: "},
        {"{\"channels\":[{\"name\":\"o\",\"subjects\":[\"a\"],\"deliver_prefix\":\"q\\nx\"}]}",
         "channels[0].deliver_prefix: "},
    };
    RUN(cases);
    /* the text "\u0000" (an escaped backslash, then "u0000") is no NUL: a password may hold it */
    fx_config c;
    parse_ok("{\"etcd\":{\"username\":\"u\",\"password\":\"p\\\\u0000\"}," CHANNELS "}", &c);
    assert_string_equal(c.etcd.password, "p\\u0000");
    fx_config_free(&c);
}

static void test_err_subjects_and_prefixes(void **state)
{
    (void)state;
    static const err_case cases[] = {
        {"{\"channels\":[{\"name\":\"a\",\"deliver_prefix\":\"q\"}]}", "channels[0].subjects: required"},
        {"{\"channels\":[{\"name\":\"a\",\"subjects\":[],\"deliver_prefix\":\"q\"}]}",
         "channels[0].subjects: must not be empty"},
        {"{\"channels\":[{\"name\":\"a\",\"subjects\":[\"ok\",\"orders..x\"],\"deliver_prefix\":\"q\"}]}",
         "channels[0].subjects[1]: \"orders..x\" is not a valid subject"},
        {"{\"channels\":[{\"name\":\"a\",\"subjects\":[\"orders.>.x\"],\"deliver_prefix\":\"q\"}]}",
         "channels[0].subjects[0]: \"orders.>.x\" is not a valid subject"},
        {"{\"channels\":[{\"name\":\"a\",\"subjects\":[\"orders.eu*\"],\"deliver_prefix\":\"q\"}]}",
         "channels[0].subjects[0]: \"orders.eu*\" is not a valid subject"},
        {"{\"channels\":[{\"name\":\"a\",\"subjects\":[\"$SYS.>\"],\"deliver_prefix\":\"q\"}]}",
         "channels[0].subjects[0]: \"$SYS.>\": subjects starting with '$' are reserved"},
        {"{\"channels\":[{\"name\":\"a\",\"subjects\":[\"a\"]}]}", "channels[0].deliver_prefix: required"},
        {"{\"channels\":[{\"name\":\"a\",\"subjects\":[\"a\"],\"deliver_prefix\":\"q.*\"}]}",
         "channels[0].deliver_prefix: \"q.*\" is not a literal subject"},
        {"{\"channels\":[{\"name\":\"a\",\"subjects\":[\"a\"],\"deliver_prefix\":\"q.\"}]}",
         "channels[0].deliver_prefix: \"q.\" is not a literal subject"},
        {"{\"channels\":[{\"name\":\"a\",\"subjects\":[\"a\"],\"deliver_prefix\":\"$q\"}]}",
         "channels[0].deliver_prefix: \"$q\": must not start with '$'"},
        {"{\"channels\":[{\"name\":\"a\",\"subjects\":[\"a\"],\"deliver_prefix\":\"\"}]}",
         "channels[0].deliver_prefix: \"\" is not a literal subject"},
        /* two channels share a deliver prefix */
        {"{\"channels\":[" CH_ORDERS ",{\"name\":\"b\",\"subjects\":[\"b\"],\"deliver_prefix\":\"q.orders\"}]}",
         "channels[1].deliver_prefix: \"q.orders\" is also the deliver_prefix of channels[0] (\"orders\")"},
        /* a prefix equal to another channel's dead-letter prefix */
        {"{\"channels\":[" CH_ORDERS ",{\"name\":\"b\",\"subjects\":[\"b\"],\"deliver_prefix\":\"q.orders-dlq\"}]}",
         "channels[1].deliver_prefix: delivery subjects \"q.orders-dlq.>\" overlap \"q.orders-dlq.>\" of channels[0]"},
        /* nested delivery spaces */
        {"{\"channels\":[" CH_ORDERS ",{\"name\":\"b\",\"subjects\":[\"b\"],\"deliver_prefix\":\"q.orders.b\"}]}",
         "channels[1].deliver_prefix: delivery subjects \"q.orders.b.>\" overlap \"q.orders.>\" of channels[0]"},
        {"{\"channels\":[" CH_ORDERS ",{\"name\":\"b\",\"subjects\":[\"b\"],\"deliver_prefix\":\"q\"}]}",
         "channels[1].deliver_prefix: delivery subjects \"q.>\" overlap \"q.orders.>\""},
        /* capture subjects of two channels overlap */
        {"{\"channels\":[" CH_ORDERS ",{\"name\":\"b\",\"subjects\":[\"b\",\"orders.eu.*\"],\"deliver_prefix\":\"q.b\"}]}",
         "channels[1].subjects[1]: \"orders.eu.*\" overlaps channels[0].subjects[0] (\"orders.>\")"},
        {"{\"channels\":[{\"name\":\"a\",\"subjects\":[\"*.new\"],\"deliver_prefix\":\"q.a\"},"
         "{\"name\":\"b\",\"subjects\":[\"orders.*\"],\"deliver_prefix\":\"q.b\"}]}",
         "channels[1].subjects[0]: \"orders.*\" overlaps channels[0].subjects[0] (\"*.new\")"},
        /* and within one channel (a publish would be captured twice) */
        {"{\"channels\":[{\"name\":\"a\",\"subjects\":[\"orders.>\",\"orders.eu\"],\"deliver_prefix\":\"q.a\"}]}",
         "channels[0].subjects[1]: \"orders.eu\" overlaps channels[0].subjects[0] (\"orders.>\")"},
        {"{\"channels\":[{\"name\":\"a\",\"subjects\":[\"x\",\"x\"],\"deliver_prefix\":\"q.a\"}]}",
         "channels[0].subjects[1]: \"x\" overlaps channels[0].subjects[0]"},
        /* capture subject vs a delivery space: own, other, dead-letter */
        {"{\"channels\":[{\"name\":\"a\",\"subjects\":[\"q.>\"],\"deliver_prefix\":\"q.a\"}]}",
         "channels[0].subjects[0]: \"q.>\" overlaps the delivery subjects \"q.a.>\" of channels[0] (\"a\")"},
        {"{\"channels\":[" CH_ORDERS ",{\"name\":\"b\",\"subjects\":[\"q.orders.alice\"],\"deliver_prefix\":\"q.b\"}]}",
         "channels[1].subjects[0]: \"q.orders.alice\" overlaps the delivery subjects \"q.orders.>\" of channels[0]"},
        {"{\"channels\":[{\"name\":\"b\",\"subjects\":[\"q.orders-dlq.*\"],\"deliver_prefix\":\"q.b\"}," CH_ORDERS "]}",
         "channels[0].subjects[0]: \"q.orders-dlq.*\" overlaps the delivery subjects \"q.orders-dlq.>\" of channels[1]"},
        /* dead-letter space is reserved also with ack none */
        {"{\"channels\":[{\"name\":\"a\",\"subjects\":[\"a\"],\"deliver_prefix\":\"q.a\",\"ack\":\"none\"},"
         "{\"name\":\"b\",\"subjects\":[\"q.a-dlq.x\"],\"deliver_prefix\":\"q.b\"}]}",
         "channels[1].subjects[0]: \"q.a-dlq.x\" overlaps the delivery subjects \"q.a-dlq.>\""},
        /* request replies */
        {"{\"channels\":[{\"name\":\"a\",\"subjects\":[\"*.*\"],\"deliver_prefix\":\"q.a\"}]}",
         "channels[0].subjects[0]: \"*.*\" would capture request replies"},
        {"{\"channels\":[{\"name\":\"a\",\"subjects\":[\"x\",\"*.>\"],\"deliver_prefix\":\"q.a\"}]}",
         "channels[0].subjects[1]: \"*.>\" would capture request replies"},
        {"{\"channels\":[{\"name\":\"a\",\"subjects\":[\"_INBOX.abc\"],\"deliver_prefix\":\"q.a\"}]}",
         "channels[0].subjects[0]: \"_INBOX.abc\" would capture request replies"},
        {"{\"channels\":[{\"name\":\"a\",\"subjects\":[\">\"],\"deliver_prefix\":\"q.a\"}]}",
         "channels[0].subjects[0]: \">\" would capture request replies"},
    };
    RUN(cases);
}

/* Caps on sizes: the overlap checks are pairwise, so the total of capture subjects is bounded;
 * a config at the cap is still checked quickly. */
static void test_err_size_caps(void **state)
{
    (void)state;
    size_t cap = 64 * 1024;
    char *j = malloc(cap);
    assert_non_null(j);
    size_t n = (size_t)snprintf(j, cap, "{\"channels\":[");
    for (int ch = 0; ch < 17; ch++) {
        n += (size_t)snprintf(j + n, cap - n, "%s{\"name\":\"c%d\",\"deliver_prefix\":\"q.c%d\",\"subjects\":[",
                              ch ? "," : "", ch, ch);
        for (int k = 0; k < 241; k++)
            n += (size_t)snprintf(j + n, cap - n, "%s\"s%d.t%d.>\"", k ? "," : "", ch, k);
        n += (size_t)snprintf(j + n, cap - n, "]}");
    }
    snprintf(j + n, cap - n, "]}");
    assert_true(n < cap - 8);
    char err[512];
    fx_config c;
    /* 17 * 241 = 4097 subjects: one too many */
    assert_int_equal(parse(j, &c, err, sizeof err), -1);
    assert_string_equal(err, "channels[16].subjects: more than 4096 capture subjects in all channels");
    /* 17 channels with 240 subjects each (4080) pass, every pair checked */
    n = (size_t)snprintf(j, cap, "{\"channels\":[");
    for (int ch = 0; ch < 17; ch++) {
        n += (size_t)snprintf(j + n, cap - n, "%s{\"name\":\"c%d\",\"deliver_prefix\":\"q.c%d\",\"subjects\":[",
                              ch ? "," : "", ch, ch);
        for (int k = 0; k < 240; k++)
            n += (size_t)snprintf(j + n, cap - n, "%s\"s%d.t%d.>\"", k ? "," : "", ch, k);
        n += (size_t)snprintf(j + n, cap - n, "]}");
    }
    snprintf(j + n, cap - n, "]}");
    parse_ok(j, &c);
    assert_int_equal(c.n_channels, 34);
    fx_config_free(&c);
    free(j);

    static const err_case cases[] = {
        {"{\"etcd\":{\"endpoints\":[\"http://a:1\",\"http://a:1\",\"http://a:1\",\"http://a:1\","
         "\"http://a:1\",\"http://a:1\",\"http://a:1\",\"http://a:1\",\"http://a:1\",\"http://a:1\","
         "\"http://a:1\",\"http://a:1\",\"http://a:1\",\"http://a:1\",\"http://a:1\",\"http://a:1\","
         "\"http://a:1\"]}," CHANNELS "}",
         "etcd.endpoints: at most 16 entries"},
    };
    RUN(cases);
}

/* Secrets are never echoed in errors. */
static void test_err_no_secret_echo(void **state)
{
    (void)state;
    char err[512];
    fx_config c;
    assert_int_equal(parse("{\"nats\":{\"url\":\"http://u:s3cret@h:4222\"}," CHANNELS "}", &c, err,
                           sizeof err), -1);
    assert_null(strstr(err, "s3cret"));
    assert_int_equal(parse("{\"etcd\":{\"endpoints\":[\"grpc://u:s3cret@h\"]}," CHANNELS "}", &c,
                           err, sizeof err), -1);
    assert_null(strstr(err, "s3cret"));
    assert_int_equal(parse("{\"nats\":{\"user\":\"u\",\"password\":7}," CHANNELS "}", &c, err,
                           sizeof err), -1);
    assert_string_equal(err, "nats.password: must be a string");
}

/* ---- nats.leaf_url (plugin/leaf.h) -------------------------------------------------------- */

static void test_leaf_url(void **state)
{
    (void)state;
    fx_config c;
    parse_ok("{" CHANNELS "}", &c);
    assert_null(c.nats.leaf_url); /* optional: no leaf connection */
    fx_config_free(&c);
    parse_ok("{\"nats\":{\"leaf_url\":\"\"}," CHANNELS "}", &c);
    assert_null(c.nats.leaf_url); /* "" = not set */
    fx_config_free(&c);
    static const char *const ok[] = {
        "nats://127.0.0.1:7422", "nats://localhost", "nats://[::1]:24223",
        "nats://leaf:p%40ss@127.0.0.1:7422/", "nats://u@h:1",
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        char json[256];
        snprintf(json, sizeof json, "{\"nats\":{\"leaf_url\":\"%s\"}," CHANNELS "}", ok[i]);
        parse_ok(json, &c);
        assert_string_equal(c.nats.leaf_url, ok[i]);
        fx_config_free(&c);
    }

    err_case cases[] = {
        {"{\"nats\":{\"leaf_url\":5}," CHANNELS "}", "nats.leaf_url: must be a string"},
        {"{\"nats\":{\"leaf_url\":\"tls://127.0.0.1:7422\"}," CHANNELS "}",
         "nats.leaf_url: tls:// is not supported"},
        {"{\"nats\":{\"leaf_url\":\"http://127.0.0.1:7422\"}," CHANNELS "}",
         "nats.leaf_url: must be a nats://host:port URL"},
        {"{\"nats\":{\"leaf_url\":\"127.0.0.1:7422\"}," CHANNELS "}",
         "nats.leaf_url: must be a nats://host:port URL"},
        {"{\"nats\":{\"leaf_url\":\"nats://:7422\"}," CHANNELS "}",
         "nats.leaf_url: must be nats://host:port with a host"},
        {"{\"nats\":{\"leaf_url\":\"nats://\"}," CHANNELS "}", "nats.leaf_url: must be nats://host:port"},
        {"{\"nats\":{\"leaf_url\":\"nats://[::1\"}," CHANNELS "}", "nats.leaf_url: must be nats://host:port"},
        {"{\"nats\":{\"leaf_url\":\"nats://::1:7422\"}," CHANNELS "}", "nats.leaf_url: must be nats://host:port with a host (IPv6 in brackets)"},
        {"{\"nats\":{\"leaf_url\":\"nats://h:0\"}," CHANNELS "}", "nats.leaf_url: port must be 1..65535"},
        {"{\"nats\":{\"leaf_url\":\"nats://h:65536\"}," CHANNELS "}", "nats.leaf_url: port must be 1..65535"},
        {"{\"nats\":{\"leaf_url\":\"nats://h:\"}," CHANNELS "}", "nats.leaf_url: port must be 1..65535"},
        {"{\"nats\":{\"leaf_url\":\"nats://h:74x\"}," CHANNELS "}", "nats.leaf_url: port must be 1..65535"},
        {"{\"nats\":{\"leaf_url\":\"nats://h:1,nats://g:1\"}," CHANNELS "}", "nats.leaf_url: one URL only"},
        {"{\"nats\":{\"leaf_url\":\"nats://h:1/leaf\"}," CHANNELS "}", "nats.leaf_url: must not have a path"},
        {"{\"nats\":{\"leaf_url\":\"nats://h 1\"}," CHANNELS "}", "nats.leaf_url: must not contain whitespace"},
        {"{\"nats\":{\"leaf_url\":\"nats://:pw@h:1\"}," CHANNELS "}", "nats.leaf_url: empty user name"},
        {"{\"nats\":{\"leaf_url\":\"nats://u:p%zz@h:1\"}," CHANNELS "}", "nats.leaf_url: invalid password"},
        {"{\"nats\":{\"leaf_url\":\"nats://u:p%4@h:1\"}," CHANNELS "}", "nats.leaf_url: invalid password"},
    };
    RUN(cases);

    /* the password is never echoed */
    char err[512];
    assert_int_equal(parse("{\"nats\":{\"leaf_url\":\"tls://u:s3cret@h:1\"}," CHANNELS "}", &c,
                           err, sizeof err), -1);
    assert_null(strstr(err, "s3cret"));
    assert_int_equal(parse("{\"nats\":{\"leaf_url\":\"nats://u:s3cret@h:99999\"}," CHANNELS "}",
                           &c, err, sizeof err), -1);
    assert_null(strstr(err, "s3cret"));

    /* what the daemon gets from the parser */
    fx_leaf_url u;
    assert_int_equal(fx_leaf_url_parse("nats://leaf:p%40ss%3A@127.0.0.1:7422", &u, err, sizeof err), 0);
    assert_string_equal(u.host, "127.0.0.1");
    assert_int_equal(u.port, 7422);
    assert_true(u.has_user);
    assert_string_equal(u.user, "leaf");
    assert_string_equal(u.pass, "p@ss:");
    assert_int_equal(fx_leaf_url_parse("nats://[::1]", &u, err, sizeof err), 0);
    assert_string_equal(u.host, "::1");
    assert_int_equal(u.port, FX_LEAF_DEFAULT_PORT);
    assert_false(u.has_user);
    assert_int_equal(fx_leaf_url_parse("nats://a@b@h:5", &u, err, sizeof err), 0); /* last '@' */
    assert_string_equal(u.user, "a@b");
    assert_string_equal(u.host, "h");
    assert_int_equal(u.port, 5);
    assert_int_equal(fx_leaf_url_parse(NULL, &u, err, sizeof err), -1);
}

/* ---- DLQ generation ---------------------------------------------------------------------- */

static void test_dlq_generation(void **state)
{
    (void)state;
    fx_config c;
    parse_ok("{\"defaults\":{\"capacity\":42},\"channels\":["
             "{\"name\":\"orders\",\"subjects\":[\"orders.>\"],\"deliver_prefix\":\"q.orders\","
             " \"max_deliver\":3,\"ack_wait\":\"2s\"},"
             "{\"name\":\"events\",\"subjects\":[\"events.>\"],\"deliver_prefix\":\"q.events\","
             " \"ack\":\"none\"},"
             "{\"name\":\"jobs\",\"subjects\":[\"jobs.>\"],\"deliver_prefix\":\"w.jobs\"}]}",
             &c);
    assert_int_equal(c.n_channels, 5);
    /* configured first, in file order; then the DLQs in the same order */
    static const char *const names[] = {"orders", "events", "jobs", "orders-dlq", "jobs-dlq"};
    static const char *const prefixes[] = {"q.orders", "q.events", "w.jobs", "q.orders-dlq",
                                           "w.jobs-dlq"};
    for (size_t i = 0; i < 5; i++) {
        assert_string_equal(c.channels[i].name, names[i]);
        assert_string_equal(c.channels[i].deliver_prefix, prefixes[i]);
        assert_int_equal(c.channels[i].is_dlq, i >= 3);
        assert_ptr_equal(fx_config_channel(&c, names[i]), &c.channels[i]);
    }
    const fx_chan_config *d = &c.channels[3];
    assert_int_equal(d->n_subjects, 0);
    assert_null(d->subjects);
    assert_memory_equal(&d->s, &c.channels[0].s, sizeof d->s); /* settings copied from parent */
    assert_int_equal(d->s.max_deliver, 3);
    assert_int_equal(d->s.ack_wait_ms, 2000);
    assert_int_equal(d->s.capacity, 42);
    assert_null(fx_config_channel(&c, "events-dlq"));
    assert_null(fx_config_channel(&c, "nope"));
    assert_null(fx_config_channel(&c, NULL));
    assert_null(fx_config_channel(NULL, "orders"));
    fx_config_free(&c);
}

/* ---- the documented example, and the files under deploy/ -------------------------------- */

static const char k_design_example[] =
    "{\n"
    "  \"name\": \"bridge-a\",\n"
    "  \"nats\": {\"url\": \"nats://127.0.0.1:4222\", \"monitor_url\": \"http://127.0.0.1:8222\", "
    "\"account\": \"$G\"},\n"
    "  \"etcd\": {\"endpoints\": [\"http://127.0.0.1:2379\"], \"prefix\": \"/fluxon\"},\n"
    "  \"kv\":   {\"backend\": \"etcd\", \"endpoints\": [\"http://127.0.0.1:2379\"]},\n"
    "  \"http\": {\"listen\": \"127.0.0.1:8080\"},\n"
    "  \"defaults\": {\"ttl_seconds\": 90, \"capacity\": 100000, \"ack\": \"explicit\", "
    "\"ack_wait\": \"30s\",\n"
    "               \"max_deliver\": 5, \"max_ack_pending\": 1000, \"backoff\": [\"1s\", \"5s\"],\n"
    "               \"release_after\": \"5s\", \"interest_poll\": \"1s\"},\n"
    "  \"channels\": [{\"name\": \"orders\", \"subjects\": [\"orders.>\"], \"deliver_prefix\": "
    "\"q.orders\"}]\n"
    "}\n";

static void assert_orders_config(const fx_config *c)
{
    assert_int_equal(c->n_channels, 2);
    assert_string_equal(c->channels[0].name, "orders");
    assert_int_equal(c->channels[0].n_subjects, 1);
    assert_string_equal(c->channels[0].subjects[0], "orders.>");
    assert_string_equal(c->channels[0].deliver_prefix, "q.orders");
    assert_default_settings(&c->channels[0].s);
    assert_string_equal(c->channels[1].name, "orders-dlq");
    assert_string_equal(c->channels[1].deliver_prefix, "q.orders-dlq");
    assert_true(c->channels[1].is_dlq);
    assert_string_equal(c->nats.account, "$G");
    assert_string_equal(c->etcd.prefix, "/fluxon");
    assert_string_equal(c->kv.backend, "etcd");
}

static void test_design_example(void **state)
{
    (void)state;
    fx_config c;
    parse_ok(k_design_example, &c);
    assert_string_equal(c.name, "bridge-a");
    assert_string_equal(c.nats.url, "nats://127.0.0.1:4222");
    assert_string_equal(c.nats.monitor_url, "http://127.0.0.1:8222");
    assert_string_equal(c.etcd.endpoints[0], "http://127.0.0.1:2379");
    assert_string_equal(c.kv.endpoints[0], "http://127.0.0.1:2379");
    assert_string_equal(c.http.listen, "127.0.0.1:8080");
    assert_default_settings(&c.defaults);
    assert_orders_config(&c);
    fx_config_free(&c);
}

static void load_ok(const char *path, fx_config *c)
{
    char err[512];
    memset(c, 0, sizeof *c);
    if (fx_config_load_file(path, c, err, sizeof err) != 0)
        fail_msg("%s: %s (tests run with cwd = repository root)", path, err);
}

static void test_deploy_examples(void **state)
{
    (void)state;
    fx_config s, a, b, l;
    load_ok("deploy/bridge-single.json", &s);
    assert_orders_config(&s);
    assert_string_equal(s.nats.url, "nats://127.0.0.1:4222");
    assert_string_equal(s.nats.monitor_url, "http://127.0.0.1:8222");
    assert_string_equal(s.etcd.endpoints[0], "http://127.0.0.1:2379");
    assert_string_equal(s.http.listen, "127.0.0.1:8080");
    assert_string_equal(s.nats.leaf_url, "nats://127.0.0.1:7422"); /* deploy/nats-server.conf */

    fx_config r;
    load_ok("deploy/bridge-redis.json", &r); /* the Redis payload plane */
    assert_int_equal(r.n_channels, 2);
    assert_string_equal(r.channels[0].name, "orders");
    assert_string_equal(r.kv.backend, "redis");
    assert_string_equal(r.kv.url, "redis://127.0.0.1:6379/0");
    assert_true(r.kv.require_fsync);
    assert_int_equal(r.kv.timeout_ms, 3000);
    assert_int_equal(r.kv.n_endpoints, 0);
    fx_config_free(&r);

    load_ok("deploy/bridge-a.json", &a);
    load_ok("deploy/bridge-b.json", &b);
    assert_orders_config(&a);
    assert_orders_config(&b);
    assert_string_not_equal(a.name, b.name);
    assert_string_not_equal(a.http.listen, b.http.listen);
    assert_string_equal(a.etcd.endpoints[0], b.etcd.endpoints[0]); /* one shared etcd */
    assert_string_equal(a.etcd.prefix, b.etcd.prefix);
    assert_string_equal(a.nats.url, b.nats.url);
    assert_string_equal(a.nats.leaf_url, "nats://127.0.0.1:7422");
    assert_string_equal(a.nats.leaf_url, b.nats.leaf_url);
    assert_int_equal(a.n_channels, b.n_channels);
    for (size_t i = 0; i < a.n_channels; i++) {
        assert_string_equal(a.channels[i].name, b.channels[i].name);
        assert_string_equal(a.channels[i].deliver_prefix, b.channels[i].deliver_prefix);
        assert_memory_equal(&a.channels[i].s, &b.channels[i].s, sizeof a.channels[i].s);
    }

    load_ok("deploy/local/bridge.json", &l);
    assert_int_equal(l.n_channels, 2);
    assert_string_equal(l.channels[0].name, "orders");
    assert_string_equal(l.nats.url, "nats://127.0.0.1:24222");
    assert_string_equal(l.nats.monitor_url, "http://127.0.0.1:28222");
    assert_string_equal(l.etcd.endpoints[0], "http://127.0.0.1:23790");
    assert_string_equal(l.kv.backend, "redis"); /* make run: the Redis plane (BENCHMARKS.md) */
    assert_string_equal(l.kv.url, "redis://127.0.0.1:26379"); /* deploy/local/stack.sh */
    assert_string_equal(l.http.listen, "127.0.0.1:28080");
    assert_string_equal(l.nats.leaf_url, "nats://127.0.0.1:24223"); /* deploy/local/stack.sh */
    fx_config_free(&s);
    fx_config_free(&a);
    fx_config_free(&b);
    fx_config_free(&l);

    fx_config sec; /* deploy/secure/nats-server.conf: account FLUXON, users per role */
    load_ok("deploy/secure/bridge-a.json", &sec);
    assert_int_equal(sec.n_channels, 2);
    assert_string_equal(sec.channels[0].subjects[0], "orders.>"); /* publisher / capture perms */
    assert_string_equal(sec.channels[0].deliver_prefix, "q.orders"); /* consumer perms */
    assert_string_equal(sec.name, "bridge-a"); /* the name in the server's ack permissions */
    assert_string_equal(sec.nats.account, "FLUXON");
    assert_string_equal(sec.nats.user, "fluxon-bridge");
    assert_non_null(sec.nats.password);
    assert_non_null(strstr(sec.nats.leaf_url, "nats://fluxon-leaf:"));
    fx_config_free(&sec);
}

static void test_load_file_errors(void **state)
{
    (void)state;
    char err[512];
    fx_config c;
    assert_int_equal(fx_config_load_file("/nonexistent/fluxon.json", &c, err, sizeof err), -1);
    assert_non_null(strstr(err, "/nonexistent/fluxon.json: cannot open: "));
    assert_int_equal(fx_config_load_file("deploy", &c, err, sizeof err), -1);
    assert_non_null(strstr(err, "deploy: is a directory"));

    /* field errors are prefixed with the file name */
    const char *dir = getenv("FXT_TMPDIR");
    char path[512];
    snprintf(path, sizeof path, "%s/test_config_bad.json", dir && dir[0] ? dir : "/tmp");
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("{\"channels\":[{\"name\":\"a\",\"subjects\":[\"a\"],\"deliver_prefix\":\"q\",\"acks\":1}]}", f);
    fclose(f);
    assert_int_equal(fx_config_load_file(path, &c, err, sizeof err), -1);
    char want[600];
    snprintf(want, sizeof want, "%s: channels[0].acks: unknown key", path);
    assert_string_equal(err, want);

    /* more than 1 MiB on disk */
    f = fopen(path, "w");
    assert_non_null(f);
    for (int i = 0; i < 1024 * 1024 / 64 + 1; i++)
        fputs("                                                               \n", f);
    fclose(f);
    assert_int_equal(fx_config_load_file(path, &c, err, sizeof err), -1);
    assert_non_null(strstr(err, "larger than 1048576 bytes"));
    unlink(path);
}

/* The dedup window's bound: defaults, ranges, and the bridge-wide byte budget (512 MiB). */
static void test_dedup_bound(void **state)
{
    (void)state;
    fx_config c;
    char err[512];
    parse_ok("{" CHANNELS "}", &c);
    assert_int_equal(c.channels[0].s.duplicate_max_ids, 100000);
    assert_int_equal(c.channels[0].s.duplicate_max_bytes, 32LL << 20);
    fx_config_free(&c);
    parse_ok("{\"defaults\":{\"duplicate_max_ids\":5000},\"channels\":[{\"name\":\"a\",\"subjects\":[\"a.>\"],"
             "\"deliver_prefix\":\"q.a\",\"duplicate_max_bytes\":2097152}]}", &c);
    assert_int_equal(c.channels[0].s.duplicate_max_ids, 5000);
    assert_int_equal(c.channels[0].s.duplicate_max_bytes, 2097152);
    fx_config_free(&c);
    memset(&c, 0, sizeof c);
    assert_int_equal(parse("{\"defaults\":{\"duplicate_max_ids\":999}," CHANNELS "}", &c, err, sizeof err), -1);
    assert_non_null(strstr(err, "defaults.duplicate_max_ids"));
    fx_config_free(&c);
    memset(&c, 0, sizeof c);
    assert_int_equal(parse("{\"defaults\":{\"duplicate_max_bytes\":1000}," CHANNELS "}", &c, err, sizeof err), -1);
    assert_non_null(strstr(err, "defaults.duplicate_max_bytes"));
    fx_config_free(&c);
    /* 600 MiB set explicitly over two channels: refused, naming the budget */
    memset(&c, 0, sizeof c);
    assert_int_equal(parse("{\"defaults\":{\"duplicate_max_bytes\":314572800},\"channels\":["
                           "{\"name\":\"a\",\"subjects\":[\"a.>\"],\"deliver_prefix\":\"q.a\"},"
                           "{\"name\":\"b\",\"subjects\":[\"b.>\"],\"deliver_prefix\":\"q.b\"}]}",
                           &c, err, sizeof err), -1);
    assert_non_null(strstr(err, "at most 512 MiB per bridge"));
    fx_config_free(&c);
    /* ... unless one of them has no window */
    parse_ok("{\"defaults\":{\"duplicate_max_bytes\":314572800},\"channels\":["
             "{\"name\":\"a\",\"subjects\":[\"a.>\"],\"deliver_prefix\":\"q.a\"},"
             "{\"name\":\"b\",\"subjects\":[\"b.>\"],\"deliver_prefix\":\"q.b\",\"duplicate_window\":\"0s\"}]}", &c);
    fx_config_free(&c);
    /* 40 channels without a setting share the budget: 512 MiB / 40 each (under 32 MiB) */
    char j[8192];
    size_t n = (size_t)snprintf(j, sizeof j, "{\"channels\":[");
    for (int i = 0; i < 40; i++)
        n += (size_t)snprintf(j + n, sizeof j - n, "%s{\"name\":\"c%d\",\"subjects\":[\"c%d.>\"],\"deliver_prefix\":\"q.c%d\"}",
                              i ? "," : "", i, i, i);
    snprintf(j + n, sizeof j - n, "]}");
    parse_ok(j, &c);
    int64_t sum = 0;
    for (size_t i = 0; i < c.n_channels; i++)
        if (!c.channels[i].is_dlq) sum += c.channels[i].s.duplicate_max_bytes;
    assert_int_equal(c.channels[0].s.duplicate_max_bytes, (512LL << 20) / 40);
    assert_true(sum <= 512LL << 20);
    fx_config_free(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_overrides),
        cmocka_unit_test(test_wildcard_subjects_accepted),
        cmocka_unit_test(test_all_connection_options),
        cmocka_unit_test(test_duration_strings),
        cmocka_unit_test(test_duration_json_forms),
        cmocka_unit_test(test_err_syntax),
        cmocka_unit_test(test_err_unknown_and_duplicate_keys),
        cmocka_unit_test(test_err_types),
        cmocka_unit_test(test_err_ranges_and_durations),
        cmocka_unit_test(test_err_connection_values),
        cmocka_unit_test(test_err_names),
        cmocka_unit_test(test_control_characters_refused),
        cmocka_unit_test(test_err_subjects_and_prefixes),
        cmocka_unit_test(test_err_size_caps),
        cmocka_unit_test(test_dedup_bound),
        cmocka_unit_test(test_err_no_secret_echo),
        cmocka_unit_test(test_leaf_url),
        cmocka_unit_test(test_dlq_generation),
        cmocka_unit_test(test_design_example),
        cmocka_unit_test(test_deploy_examples),
        cmocka_unit_test(test_load_file_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
