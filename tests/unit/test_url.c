/* test_url.c -- lease/fx_url.h: the one URL parser.
 *
 * url_parts: scheme (lower-cased), user/password (percent-decoded, last '@' ends the userinfo),
 *   host (IPv6 without brackets), port (0 when absent), path (decoded, "" for "/"), query.
 * url_unix: unix:/path and unix:///path, ?query only when allowed.
 * url_refused: each malformed form gets its status and a reason.
 * url_flags: userinfo, path and query only when the caller allows them.
 * url_bounds: 4096 bytes accepted, 4097 refused; over-long parts refused.
 * url_no_secret_in_errors: no error text holds the password or the user.
 * fx_url_redacts_userinfo: fx_url_redact cuts the userinfo at the LAST '@' (user and password
 *   may hold '@', ':' and %-escapes; lists, no scheme, cut output), and fx_url_split_userinfo
 *   hands the decoded user and password apart from the URL (what cnats gets).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fx_url.h"

#define ALL (FX_URL_USERINFO | FX_URL_PATH | FX_URL_QUERY)

static void url_parts(void **state)
{
    (void)state;
    fx_url u;
    char err[200];
    assert_int_equal(fx_url_parse("NATS://leaf:p%40ss%3A@127.0.0.1:7422", ALL, &u, err, sizeof err), FX_URL_OK);
    assert_string_equal(u.scheme, "nats");
    assert_true(u.has_user);
    assert_true(u.has_password);
    assert_string_equal(u.user, "leaf");
    assert_string_equal(u.password, "p@ss:");
    assert_string_equal(u.host, "127.0.0.1");
    assert_int_equal(u.port, 7422);
    assert_string_equal(u.path, "");
    assert_false(u.has_query);

    assert_int_equal(fx_url_parse("redis://:pw@db.example:6380/3", ALL, &u, err, sizeof err), FX_URL_OK);
    assert_true(u.has_user);
    assert_string_equal(u.user, "");
    assert_string_equal(u.password, "pw");
    assert_string_equal(u.host, "db.example");
    assert_int_equal(u.port, 6380);
    assert_string_equal(u.path, "/3");

    assert_int_equal(fx_url_parse("nats://[::1]", ALL, &u, err, sizeof err), FX_URL_OK);
    assert_string_equal(u.host, "::1");
    assert_int_equal(u.port, 0);
    assert_false(u.has_user);

    assert_int_equal(fx_url_parse("http://h:2379/", 0, &u, err, sizeof err), FX_URL_OK); /* "/" is no path */
    assert_string_equal(u.path, "");

    assert_int_equal(fx_url_parse("nats://a@b@h:5", ALL, &u, err, sizeof err), FX_URL_OK); /* last '@' */
    assert_string_equal(u.user, "a@b");
    assert_false(u.has_password);
    assert_string_equal(u.host, "h");
    assert_int_equal(u.port, 5);

    assert_int_equal(fx_url_parse("https://mon:8222/a%20b?x=1", ALL, &u, err, sizeof err), FX_URL_OK);
    assert_string_equal(u.path, "/a b");
    assert_true(u.has_query);
    assert_string_equal(u.query, "x=1");
    const char *const http[] = {"http", "https", NULL};
    assert_true(fx_url_scheme_is(&u, http));
    const char *const nats[] = {"nats", NULL};
    assert_false(fx_url_scheme_is(&u, nats));
}

static void url_unix(void **state)
{
    (void)state;
    fx_url u;
    char err[200];
    assert_int_equal(fx_url_parse("unix:/run/redis.sock", 0, &u, err, sizeof err), FX_URL_OK);
    assert_string_equal(u.scheme, "unix");
    assert_string_equal(u.path, "/run/redis.sock");
    assert_string_equal(u.host, "");
    assert_int_equal(fx_url_parse("unix:///run/r.sock?db=2", FX_URL_QUERY, &u, err, sizeof err), FX_URL_OK);
    assert_string_equal(u.path, "/run/r.sock");
    assert_string_equal(u.query, "db=2");
    assert_int_equal(fx_url_parse("unix:/r.sock?db=2", 0, &u, err, sizeof err), FX_URL_EQUERY);
    assert_int_equal(fx_url_parse("unix:r.sock", 0, &u, err, sizeof err), FX_URL_EPATH);
    assert_non_null(strstr(err, "absolute"));
    assert_int_equal(fx_url_parse("unix:", 0, &u, err, sizeof err), FX_URL_EPATH);
    assert_int_equal(fx_url_parse("unix:/r#x", 0, &u, err, sizeof err), FX_URL_EFRAGMENT);
}

static void url_refused(void **state)
{
    (void)state;
    static const struct {
        const char *url;
        fx_url_status st;
        const char *why;
    } cases[] = {
        {"", FX_URL_EMISSING, "missing"},
        {"127.0.0.1:4222", FX_URL_ESCHEME, "scheme://"},
        {"nats:/h", FX_URL_ESCHEME, "scheme://"},
        {"1nats://h", FX_URL_ESCHEME, "scheme://"},
        {"nats://", FX_URL_EHOST, "host"},
        {"nats://:4222", FX_URL_EHOST, "host"},
        {"nats://u:p@", FX_URL_EHOST, "host"},
        {"nats://[::1", FX_URL_EHOST, "host"},
        {"nats://::1:7422", FX_URL_EHOST, "host"},
        {"nats://h:0", FX_URL_EPORT, "1..65535"},
        {"nats://h:65536", FX_URL_EPORT, "1..65535"},
        {"nats://h:", FX_URL_EPORT, "1..65535"},
        {"nats://[::1]:", FX_URL_EPORT, "1..65535"},
        {"nats://h:74x", FX_URL_EPORT, "1..65535"},
        {"nats://h:1:2", FX_URL_EHOST, "host"},
        {"nats://h:1,nats://g:1", FX_URL_ELIST, "one URL"},
        {"nats://h 1", FX_URL_ESPACE, "whitespace"},
        {"nats://h\t1", FX_URL_ESPACE, "whitespace"},
        {"nats://u:p%zz@h:1", FX_URL_EPASSWORD, "password"},
        {"nats://u:p%4@h:1", FX_URL_EPASSWORD, "password"},
        {"nats://u:p%00@h:1", FX_URL_EPASSWORD, "password"},
        {"nats://u%g1@h:1", FX_URL_EUSER, "user"},
        {"nats://h:1#frag", FX_URL_EFRAGMENT, "fragment"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        fx_url u;
        char err[200] = "";
        fx_url_status st = fx_url_parse(cases[i].url, ALL, &u, err, sizeof err);
        if (st != cases[i].st || !strstr(err, cases[i].why))
            fail_msg("case %zu: got status %d (%s), want %d with \"%s\"", i, (int)st, err,
                     (int)cases[i].st, cases[i].why);
        assert_string_equal(u.password, ""); /* wiped */
    }
    fx_url u;
    assert_int_equal(fx_url_parse(NULL, ALL, &u, NULL, 0), FX_URL_EMISSING);
    assert_int_equal(fx_url_parse("nats://h", ALL, NULL, NULL, 0), FX_URL_EMISSING);
}

static void url_flags(void **state)
{
    (void)state;
    fx_url u;
    char err[200];
    assert_int_equal(fx_url_parse("http://u:p@h:1", 0, &u, err, sizeof err), FX_URL_EUSER);
    assert_non_null(strstr(err, "credentials"));
    assert_int_equal(fx_url_parse("http://h:1/x", 0, &u, err, sizeof err), FX_URL_EPATH);
    assert_non_null(strstr(err, "path"));
    assert_int_equal(fx_url_parse("http://h:1/?a=b", FX_URL_PATH, &u, err, sizeof err), FX_URL_EQUERY);
    assert_int_equal(fx_url_parse("http://h:1/x?a=b", FX_URL_PATH | FX_URL_QUERY, &u, err, sizeof err),
                     FX_URL_OK);
    assert_string_equal(u.path, "/x");
}

static void url_bounds(void **state)
{
    (void)state;
    fx_url u;
    char err[200];
    char *big = malloc(FX_URL_MAX + 2);
    assert_non_null(big);
    /* 4096 bytes: "http://h/" + a path of 4087 'a' -> over the path cap (1023), refused as such */
    memcpy(big, "http://h/", 9);
    memset(big + 9, 'a', FX_URL_MAX - 9);
    big[FX_URL_MAX] = '\0';
    assert_int_equal(fx_url_parse(big, ALL, &u, err, sizeof err), FX_URL_EPATH);
    assert_non_null(strstr(err, "too long"));
    big[FX_URL_MAX] = 'a';
    big[FX_URL_MAX + 1] = '\0';
    assert_int_equal(fx_url_parse(big, ALL, &u, err, sizeof err), FX_URL_ELONG);
    /* a host of 255 bytes is fine, 256 is not */
    memcpy(big, "nats://", 7);
    memset(big + 7, 'h', 255);
    big[7 + 255] = '\0';
    assert_int_equal(fx_url_parse(big, ALL, &u, err, sizeof err), FX_URL_OK);
    assert_int_equal(strlen(u.host), 255);
    big[7 + 255] = 'h';
    big[7 + 256] = '\0';
    assert_int_equal(fx_url_parse(big, ALL, &u, err, sizeof err), FX_URL_EHOST);
    /* a password of 256 bytes does not fit */
    memcpy(big, "nats://u:", 9);
    memset(big + 9, 'p', 256);
    memcpy(big + 9 + 256, "@h", 3);
    assert_int_equal(fx_url_parse(big, ALL, &u, err, sizeof err), FX_URL_EPASSWORD);
    free(big);
}

static void url_no_secret_in_errors(void **state)
{
    (void)state;
    static const char *const bad[] = {
        "nats://usr:s3cret@h:99999", "nats://usr:s3cret@:1", "nats://usr:s3cret@h:1/p",
        "nats://usr:s3cret@h:1#f", "nats://usr:s3cret%zz@h", "tls:/usr:s3cret@h",
        "nats://usr:s3cret@h:1?q", "nats://usr:s3cret@[::1:1",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        fx_url u;
        char err[300] = "";
        assert_int_not_equal(fx_url_parse(bad[i], FX_URL_USERINFO, &u, err, sizeof err), FX_URL_OK);
        assert_true(err[0] != '\0');
        if (strstr(err, "s3cret") || strstr(err, "usr")) fail_msg("case %zu: error text leaks: %s", i, err);
    }
}

static void redacted(const char *url, const char *want, const char *secret)
{
    char out[512];
    memset(out, 'x', sizeof out);
    fx_url_redact(url, out, sizeof out);
    assert_string_equal(out, want);
    if (secret && strstr(out, secret)) fail_msg("redacted %s leaks %s", out, secret);
}

static void fx_url_redacts_userinfo(void **state)
{
    (void)state;
    redacted("nats://bridge:s3cr@tpw@host:4222", "nats://***@host:4222", "tpw");
    redacted("nats://bridge:s3cr%40t%3Ap%25w@127.0.0.1:4222", "nats://***@127.0.0.1:4222", "s3cr");
    redacted("nats://us@er:pa:ss@w@h", "nats://***@h", "ss");
    redacted("nats://tok@h:1", "nats://***@h:1", "tok");
    redacted("nats://h:1", "nats://h:1", NULL);
    redacted("tls://[::1]:4222", "tls://[::1]:4222", NULL);
    redacted(NULL, "-", NULL);
    redacted("", "", NULL);
    redacted("nats://a:x1@h1:1,nats://h2:2,nats://b:y2@h2:2", "nats://***@h1:1,nats://h2:2,nats://***@h2:2", "x1");
    redacted("nats://u:a,b@h:1", "nats://***@h:1", "a,b");     /* ',' inside a password */
    redacted("u:pw@h:4222", "***@h:4222", "pw");                 /* no scheme (cnats takes it) */
    redacted("http://u:p/w@mon:8222/x", "http://***@mon:8222/x", "p/w"); /* unescaped '/' */
    redacted("redis://:pw@db:6379/0", "redis://***@db:6379/0", "pw");
    /* cut to fit: still NUL-terminated, still no secret */
    char small[12];
    fx_url_redact("nats://u:s3cret@averylonghost:4222", small, sizeof small);
    assert_int_equal(strlen(small), sizeof small - 1);
    assert_null(strstr(small, "s3"));
    fx_url_redact("nats://u:p@h", small, 1);
    assert_string_equal(small, "");

    /* decoding for clients that take credentials apart (cnats: nats.url, fluxonctl --server) */
    fx_url c;
    char out[256], err[200];
    assert_int_equal(fx_url_split_userinfo("nats://bridge:s3cr%40t%3Ap%25w@127.0.0.1:4222", out, sizeof out,
                                           &c, err, sizeof err), FX_URL_OK);
    assert_string_equal(out, "nats://127.0.0.1:4222");
    assert_true(c.has_user && c.has_password);
    assert_string_equal(c.user, "bridge");
    assert_string_equal(c.password, "s3cr@t:p%w");
    assert_int_equal(fx_url_split_userinfo("nats://bridge:s3cr@tpw@host:1", out, sizeof out, &c, err, sizeof err),
                     FX_URL_OK);
    assert_string_equal(out, "nats://host:1");
    assert_string_equal(c.password, "s3cr@tpw");
    assert_int_equal(fx_url_split_userinfo("nats://to%3Aken@h", out, sizeof out, &c, err, sizeof err), FX_URL_OK);
    assert_string_equal(out, "nats://h");
    assert_true(c.has_user && !c.has_password);
    assert_string_equal(c.user, "to:ken");
    assert_int_equal(fx_url_split_userinfo("nats://a:x@h1:1,nats://h2:2,tls://b:y@h3", out, sizeof out, &c, err,
                                           sizeof err), FX_URL_OK);
    assert_string_equal(out, "nats://h1:1,nats://h2:2,tls://h3");
    assert_string_equal(c.user, "a"); /* the first element's */
    assert_string_equal(c.password, "x");
    assert_int_equal(fx_url_split_userinfo("127.0.0.1:4222", out, sizeof out, &c, err, sizeof err), FX_URL_OK);
    assert_string_equal(out, "127.0.0.1:4222");
    assert_false(c.has_user);
    assert_int_equal(fx_url_split_userinfo("u:p%41@127.0.0.1:4222", out, sizeof out, &c, err, sizeof err), FX_URL_OK);
    assert_string_equal(out, "127.0.0.1:4222");
    assert_string_equal(c.password, "pA");
    /* refusals: no credential in out, cred or err */
    assert_int_equal(fx_url_split_userinfo("nats://usr:s3cret%zz@h", out, sizeof out, &c, err, sizeof err),
                     FX_URL_EPASSWORD);
    assert_string_equal(out, "");
    assert_false(c.has_user);
    assert_null(strstr(err, "s3cret"));
    assert_int_equal(fx_url_split_userinfo("nats://h:1,nats://usr:s3cret@:1", out, sizeof out, &c, err, sizeof err),
                     FX_URL_EHOST);
    assert_string_equal(out, "");
    assert_null(strstr(err, "s3cret"));
    assert_int_equal(fx_url_split_userinfo("nats://u:p@h", out, 8, &c, err, sizeof err), FX_URL_ELONG);
    assert_int_equal(fx_url_split_userinfo(NULL, out, sizeof out, &c, err, sizeof err), FX_URL_EMISSING);
    /* for clients that end the userinfo at the first '@' (libcurl: nats.monitor_url) */
    assert_int_equal(fx_url_normalize("http://mon:p@ss@w@h:8222/x@y?q=@", out, sizeof out), FX_URL_OK);
    assert_string_equal(out, "http://mon:p%40ss%40w@h:8222/x@y?q=@");
    assert_int_equal(fx_url_normalize("http://h:8222", out, sizeof out), FX_URL_OK);
    assert_string_equal(out, "http://h:8222");
    assert_int_equal(fx_url_normalize("http://a@b@h", out, 12), FX_URL_ELONG);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(url_parts),  cmocka_unit_test(url_unix),
        cmocka_unit_test(url_refused), cmocka_unit_test(url_flags),
        cmocka_unit_test(url_bounds), cmocka_unit_test(url_no_secret_in_errors),
        cmocka_unit_test(fx_url_redacts_userinfo),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
