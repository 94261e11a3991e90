/* Unit tests: strict standard base64 (fx_b64), as etcd's JSON gateway speaks it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "fx_b64.h"

static const struct {
    const char *plain, *enc;
} rfc4648[] = {
    {"", ""},         {"f", "Zg=="},         {"fo", "Zm8="},         {"foo", "Zm9v"},
    {"foob", "Zm9vYg=="}, {"fooba", "Zm9vYmE="}, {"foobar", "Zm9vYmFy"},
    {"app/", "YXBwLw=="}, {"app0", "YXBwMA=="},  {"jobs/", "am9icy8="},
};

static void rfc4648_vectors_encode_and_decode(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof rfc4648 / sizeof rfc4648[0]; i++) {
        const char *p = rfc4648[i].plain, *e = rfc4648[i].enc;
        char out[32];
        memset(out, 'X', sizeof out);
        assert_int_equal(fx_b64_enc_len(strlen(p)), strlen(e));
        assert_int_equal(fx_b64_encode((const uint8_t *)p, strlen(p), out), strlen(e));
        assert_string_equal(out, e);
        uint8_t dec[32];
        size_t n = 999;
        assert_int_equal(fx_b64_decode(e, strlen(e), dec, &n), 0);
        assert_int_equal(n, strlen(p));
        if (n) assert_memory_equal(dec, p, n);
        assert_true(fx_b64_dec_maxlen(strlen(e)) >= n);
    }
}

static void std_alphabet_plus_slash(void **state)
{
    (void)state;
    const uint8_t in[] = {0xfb, 0xff};
    char out[8];
    fx_b64_encode(in, 2, out);
    assert_string_equal(out, "+/8="); /* bytes 0xfb 0xff: the standard alphabet, as etcd expects */
    uint8_t dec[4];
    size_t n = 0;
    assert_int_equal(fx_b64_decode("+/8=", 4, dec, &n), 0);
    assert_int_equal(n, 2);
    assert_memory_equal(dec, in, 2);
}

static void every_byte_and_length_roundtrips(void **state)
{
    (void)state;
    uint8_t in[300];
    for (size_t i = 0; i < sizeof in; i++) in[i] = (uint8_t)(i * 7 + 3);
    in[0] = 0x00;
    in[1] = 0xff;
    for (size_t len = 0; len <= sizeof in; len++) {
        char *enc = malloc(fx_b64_enc_len(len) + 1);
        uint8_t *dec = malloc(fx_b64_dec_maxlen(fx_b64_enc_len(len)) + 1);
        assert_non_null(enc);
        assert_non_null(dec);
        size_t el = fx_b64_encode(in, len, enc);
        assert_int_equal(el % 4, 0);
        assert_int_equal(strlen(enc), el);
        size_t n = 12345;
        assert_int_equal(fx_b64_decode(enc, el, dec, &n), 0);
        assert_int_equal(n, len);
        if (len) assert_memory_equal(dec, in, len);
        free(enc);
        free(dec);
    }
}

static void rejects_non_strict_input(void **state)
{
    (void)state;
    static const char *const bad[] = {
        "-_8=",     /* URL-safe alphabet (etcd answers 400) */
        "Zm9vYg-_", /* URL-safe in the middle */
        "+/8",      /* missing padding */
        "Zg",       /* missing padding */
        "Zg=",      /* bad length */
        "Z",        /* bad length */
        "Zg==Zg==", /* padding before the end: garbage after padding */
        "Zg==A",    /* garbage after padding, bad length */
        "Zm8=Zm9v", /* '=' inside */
        "Z===",     /* too much padding */
        "====",     /* only padding */
        "=Zm9",     /* padding first */
        "Zm=v",     /* '=' not at the end */
        "Zh==",     /* non-zero bits under the padding (not canonical) */
        "Zm9=",     /* non-zero bits under the padding (not canonical) */
        "Zm9v\n",   /* whitespace */
        " Zm9",     /* whitespace */
        "Zm\x80v",  /* high byte */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint8_t dec[16];
        size_t n = 777;
        assert_int_equal(fx_b64_decode(bad[i], strlen(bad[i]), dec, &n), -1);
        assert_int_equal(n, 777); /* untouched on failure */
    }
    /* An embedded NUL is not an alphabet character either. */
    uint8_t dec[8];
    size_t n = 0;
    assert_int_equal(fx_b64_decode("Zm\0v", 4, dec, &n), -1);
}

static void empty_input_with_null_buffer(void **state)
{
    (void)state;
    size_t n = 5;
    assert_int_equal(fx_b64_decode("", 0, NULL, &n), 0);
    assert_int_equal(n, 0);
    char out[1] = {'X'};
    assert_int_equal(fx_b64_encode(NULL, 0, out), 0);
    assert_int_equal(out[0], '\0');
    assert_int_equal(fx_b64_enc_len(0), 0);
    assert_int_equal(fx_b64_enc_len(1), 4);
    assert_int_equal(fx_b64_enc_len(3), 4);
    assert_int_equal(fx_b64_enc_len(4), 8);
    assert_int_equal(fx_b64_dec_maxlen(8), 6);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(rfc4648_vectors_encode_and_decode),
        cmocka_unit_test(std_alphabet_plus_slash),
        cmocka_unit_test(every_byte_and_length_roundtrips),
        cmocka_unit_test(rejects_non_strict_input),
        cmocka_unit_test(empty_input_with_null_buffer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
