/* Unit tests: Redis request encoding (fx_resp) is byte for byte what hiredis's
 * redisFormatCommandArgv makes of the same argv, and its sizes are exact. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <hiredis/hiredis.h>
#include <stdlib.h>
#include <string.h>

#include "fx_resp.h"

/* Encode argv both ways and compare; the buffer is sized exactly (ASan would see an overrun) and
 * fx_resp_cmd must end at its end. */
static void same_as_hiredis(int argc, const char **argv, const size_t *lens)
{
    char *want = NULL;
    int wl = redisFormatCommandArgv(&want, argc, argv, lens);
    assert_true(wl > 0);
    size_t size = fx_resp_cmd_size(argc, lens);
    assert_int_equal(size, (size_t)wl);
    char *got = malloc(size);
    assert_non_null(got);
    char *end = fx_resp_cmd(got, argc, argv, lens);
    assert_ptr_equal(end, got + size);
    assert_memory_equal(got, want, size);
    free(got);
    redisFreeCommand(want);
}

static void commands_match_hiredis(void **state)
{
    (void)state;
    const char *a1[] = {"MULTI"};
    size_t l1[] = {5};
    same_as_hiredis(1, a1, l1);
    const char *a2[] = {"SET", "k", ""};
    size_t l2[] = {3, 1, 0};
    same_as_hiredis(3, a2, l2);
    const char bin[] = {'a', 0, '\r', '\n', 'b'};
    const char *a3[] = {"ZADD", "l:1", "0", bin};
    size_t l3[] = {4, 3, 1, sizeof bin};
    same_as_hiredis(4, a3, l3);
}

/* Lengths and argument counts on every decimal-digit boundary. */
static void lengths_on_digit_boundaries(void **state)
{
    (void)state;
    static const size_t lens[] = {0, 1, 9, 10, 11, 99, 100, 101, 999, 1000, 9999, 10000, 65536, 1048576};
    size_t max = lens[sizeof lens / sizeof lens[0] - 1];
    char *data = malloc(max);
    assert_non_null(data);
    for (size_t i = 0; i < max; i++) data[i] = (char)(i * 31 + 7);
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
        const char *av[2] = {"SET", data};
        size_t al[2] = {3, lens[i]};
        same_as_hiredis(2, av, al);
    }
    const char **av = malloc(sizeof *av * 1001);
    size_t *al = malloc(sizeof *al * 1001);
    assert_true(av && al);
    for (int argc = 1; argc <= 1001; argc += argc < 12 ? 1 : 99) {
        for (int i = 0; i < argc; i++) {
            av[i] = data + i;
            al[i] = (size_t)(i % 13);
        }
        same_as_hiredis(argc, av, al);
    }
    free(av);
    free(al);
    free(data);
}

/* A bulk string written in pieces (head, the caller's bytes, end) is the same bulk string. */
static void bulk_in_pieces(void **state)
{
    (void)state;
    const char key[] = "msg/00000042", val[] = "payload";
    size_t len = strlen(key) + 1 + strlen(val);
    char whole[64], parts[64];
    char joined[64];
    memcpy(joined, key, strlen(key) + 1);
    memcpy(joined + strlen(key) + 1, val, strlen(val));
    char *e1 = fx_resp_bulk(whole, joined, len);
    char *w = fx_resp_bulk_head(parts, len);
    memcpy(w, key, strlen(key) + 1);
    memcpy(w + strlen(key) + 1, val, strlen(val));
    char *e2 = fx_resp_bulk_end(w + len);
    assert_int_equal(e1 - whole, e2 - parts);
    assert_int_equal((size_t)(e1 - whole), fx_resp_bulk_size(len));
    assert_memory_equal(whole, parts, (size_t)(e1 - whole));
    assert_memory_equal(whole, "$20\r\nmsg/00000042\0payload\r\n", fx_resp_bulk_size(len));
    char arr[16];
    assert_int_equal(fx_resp_arr(arr, 1000) - arr, (ptrdiff_t)fx_resp_arr_size(1000));
    assert_memory_equal(arr, "*1000\r\n", 7);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(commands_match_hiredis),
        cmocka_unit_test(lengths_on_digit_boundaries),
        cmocka_unit_test(bulk_in_pieces),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
