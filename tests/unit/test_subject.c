/* Unit tests: NATS subject validation, matching and overlap (plugin/subject.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "subject.h"

typedef struct {
    const char *s;
    bool literal_ok;  /* fx_subject_valid(s, false) */
    bool wild_ok;     /* fx_subject_valid(s, true) */
} valid_case;

static void test_valid(void **state)
{
    (void)state;
    static const valid_case cases[] = {
        {"orders", true, true},
        {"orders.eu.new", true, true},
        {"q.orders-dlq.alice_1", true, true},
        {"caf\xc3\xa9.x", true, true}, /* UTF-8 bytes are fine */
        {"$JS.ACK.x", true, true},     /* '$' is syntax-valid; config rejects it separately */
        {"orders.*", false, true},
        {"orders.>", false, true},
        {"*", false, true},
        {">", false, true},
        {"*.*.>", false, true},
        {"", false, false},
        {".", false, false},
        {"orders.", false, false},
        {".orders", false, false},
        {"orders..eu", false, false},
        {"orders.>.eu", false, false}, /* '>' only last */
        {"orders.eu*", false, false},  /* wildcard not a whole token */
        {"orders.>x", false, false},
        {"or*ders", false, false},
        {"orders eu", false, false},
        {"orders\teu", false, false},
        {"orders\n", false, false},
        {"orders\x7f", false, false},
        {"orders\x01x", false, false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const valid_case *c = &cases[i];
        if (fx_subject_valid(c->s, false) != c->literal_ok ||
            fx_subject_valid(c->s, true) != c->wild_ok)
            fail_msg("case %zu \"%s\": literal %d wild %d expected %d %d", i, c->s,
                     fx_subject_valid(c->s, false), fx_subject_valid(c->s, true), c->literal_ok,
                     c->wild_ok);
    }
    assert_false(fx_subject_valid(NULL, true));
}

static void test_valid_length(void **state)
{
    (void)state;
    char *s = malloc(FX_SUBJECT_MAX + 2);
    assert_non_null(s);
    memset(s, 'a', FX_SUBJECT_MAX);
    s[FX_SUBJECT_MAX] = '\0';
    assert_true(fx_subject_valid(s, false));
    assert_true(fx_subject_token_valid(s));
    s[FX_SUBJECT_MAX] = 'a';
    s[FX_SUBJECT_MAX + 1] = '\0';
    assert_false(fx_subject_valid(s, false));
    assert_false(fx_subject_token_valid(s));
    free(s);
}

static void test_token_valid(void **state)
{
    (void)state;
    assert_true(fx_subject_token_valid("orders"));
    assert_true(fx_subject_token_valid("orders-dlq"));
    assert_true(fx_subject_token_valid("host_1-42"));
    assert_true(fx_subject_token_valid("$G"));
    assert_false(fx_subject_token_valid(NULL));
    assert_false(fx_subject_token_valid(""));
    assert_false(fx_subject_token_valid("a.b"));
    assert_false(fx_subject_token_valid("*"));
    assert_false(fx_subject_token_valid(">"));
    assert_false(fx_subject_token_valid("a*"));
    assert_false(fx_subject_token_valid("a>"));
    assert_false(fx_subject_token_valid("a b"));
    assert_false(fx_subject_token_valid("a\r"));
}

typedef struct {
    const char *pattern, *lit;
    bool match;
} match_case;

static void test_match(void **state)
{
    (void)state;
    static const match_case cases[] = {
        {"orders", "orders", true},
        {"orders", "orders.eu", false},
        {"orders.eu", "orders", false},
        {"orders.*", "orders.eu", true},
        {"orders.*", "orders", false},
        {"orders.*", "orders.eu.new", false},
        {"orders.>", "orders.eu", true},
        {"orders.>", "orders.eu.new.x", true},
        {"orders.>", "orders", false}, /* '>' needs at least one token */
        {">", "a", true},
        {">", "a.b.c", true},
        {"*", "a", true},
        {"*", "a.b", false},
        {"*.eu.>", "orders.eu.new", true},
        {"*.eu.>", "orders.us.new", false},
        {"orders.eu", "orders.us", false},
        {"ord", "orders", false},
        {"orders", "ord", false},
        {"orders.*", "orders.*", false}, /* lit must be literal */
        {"orders..x", "orders.a.x", false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const match_case *c = &cases[i];
        if (fx_subject_match(c->pattern, c->lit) != c->match)
            fail_msg("case %zu: match(\"%s\", \"%s\") expected %d", i, c->pattern, c->lit,
                     c->match);
        /* the no-validation form (the leaf's lookups) answers the same for valid inputs */
        if (fx_subject_valid(c->pattern, true) && fx_subject_valid(c->lit, false) &&
            fx_subject_match_valid(c->pattern, c->lit) != c->match)
            fail_msg("case %zu: match_valid(\"%s\", \"%s\") expected %d", i, c->pattern,
                     c->lit, c->match);
    }
    assert_false(fx_subject_match(NULL, "a"));
    assert_false(fx_subject_match("a", NULL));
}

static void test_overlap(void **state)
{
    (void)state;
    static const match_case cases[] = {
        {"orders", "orders", true},
        {"orders", "orders2", false},
        {"orders.>", "orders.eu", true},
        {"orders.>", "orders", false},
        {"orders.>", "orders.*", true},
        {"orders.*", "orders.eu.new", false},
        {"orders.*", "*.eu", true},
        {"orders.*.new", "*.eu.*", true},
        {"orders.*.new", "*.eu.old", false},
        {">", "anything.at.all", true},
        {"*", "a.b", false},
        {"*.>", "a", false},
        {"*.>", "a.b", true},
        {"q.orders.>", "q.orders-dlq.>", false},
        {"q.orders.>", "q.orders.x.>", true},
        {"q.orders.>", "q.>", true},
        {"q.orders", "q.orders.>", false},
        {"_INBOX.>", "*.*", true},
        {"_INBOX.>", "*", false},
        {"orders.eu.*", "orders.>", true},
        {"a.b.c", "a.b", false},
        {"a..b", "a.x.b", false}, /* invalid -> false */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const match_case *c = &cases[i];
        bool ab = fx_subject_overlap(c->pattern, c->lit);
        bool ba = fx_subject_overlap(c->lit, c->pattern);
        if (ab != c->match || ba != c->match)
            fail_msg("case %zu: overlap(\"%s\", \"%s\") = %d/%d expected %d", i, c->pattern,
                     c->lit, ab, ba, c->match);
    }
    assert_false(fx_subject_overlap(NULL, ">"));
}

/* Overlap agrees with match: for a literal b, overlap(a, b) == match(a, b). */
static void test_overlap_agrees_with_match(void **state)
{
    (void)state;
    static const char *const pats[] = {"a", "a.b", "a.*", "a.>", "*", ">", "*.b", "*.*.c", "a.b.>",
                                       "b.>"};
    static const char *const lits[] = {"a", "b", "a.b", "a.c", "b.b", "a.b.c", "x.y.c", "a.b.c.d"};
    for (size_t i = 0; i < sizeof pats / sizeof pats[0]; i++)
        for (size_t j = 0; j < sizeof lits / sizeof lits[0]; j++)
            if (fx_subject_overlap(pats[i], lits[j]) != fx_subject_match(pats[i], lits[j]))
                fail_msg("\"%s\" vs \"%s\": overlap %d match %d", pats[i], lits[j],
                         fx_subject_overlap(pats[i], lits[j]), fx_subject_match(pats[i], lits[j]));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid),
        cmocka_unit_test(test_valid_length),
        cmocka_unit_test(test_token_valid),
        cmocka_unit_test(test_match),
        cmocka_unit_test(test_overlap),
        cmocka_unit_test(test_overlap_agrees_with_match),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
