/* Unit tests: pull request parsing and the wait queue of a pull consumer (plugin/pull). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pull.h"

static dm_pull_cfg cfg0(void)
{
    dm_pull_cfg c;
    memset(&c, 0, sizeof c);
    c.max_waiting = 4;
    return c;
}

static bool parse(const char *body, const dm_pull_cfg *c, dm_pull_req *r, int *code, char *desc)
{
    return dm_pull_parse(body, strlen(body), "_INBOX.x", c, 1000, r, code, desc, 160);
}

/* JetStream: an empty body or a bare number is the batch; a JSON body has the fields. */
static void bodies(void **state)
{
    (void)state;
    dm_pull_cfg c = cfg0();
    dm_pull_req r;
    int code = 0;
    char desc[160];
    assert_true(parse("", &c, &r, &code, desc));
    assert_int_equal(r.batch, 1);
    assert_int_equal(r.expires_ms, 0);
    assert_false(r.no_wait);
    assert_string_equal(r.reply, "_INBOX.x");
    assert_true(parse(" 7", &c, &r, &code, desc));
    assert_int_equal(r.batch, 7);
    assert_true(parse("{\"batch\":10,\"expires\":2500000000,\"no_wait\":true,\"max_bytes\":4096,"
                      "\"idle_heartbeat\":500000000}",
                      &c, &r, &code, desc));
    assert_int_equal(r.batch, 10);
    assert_int_equal(r.expires_ms, 1000 + 2500);
    assert_true(r.no_wait);
    assert_int_equal(r.max_bytes, 4096);
    assert_int_equal(r.bytes, 4096);
    assert_int_equal(r.hb_ms, 500);
    assert_int_equal(r.next_hb_ms, 1500);
    assert_true(parse("{\"batch\":0}", &c, &r, &code, desc)); /* JetStream: at least 1 */
    assert_int_equal(r.batch, 1);
}

static void refusals(void **state)
{
    (void)state;
    dm_pull_cfg c = cfg0();
    c.max_batch = 20;
    c.max_bytes = 1000;
    c.max_expires_ms = 60000;
    dm_pull_req r;
    int code = 0;
    char desc[160];
    assert_false(parse("{not json", &c, &r, &code, desc));
    assert_int_equal(code, 400);
    assert_string_equal(desc, "Bad Request");
    assert_false(parse("{\"batch\":\"x\"}", &c, &r, &code, desc));
    assert_int_equal(code, 400);
    assert_false(parse("abc", &c, &r, &code, desc));
    assert_int_equal(code, 400);
    assert_false(parse("{\"batch\":21}", &c, &r, &code, desc));
    assert_int_equal(code, 409);
    assert_string_equal(desc, "Exceeded MaxRequestBatch of 20");
    assert_false(parse("{\"batch\":1,\"max_bytes\":1001}", &c, &r, &code, desc));
    assert_string_equal(desc, "Exceeded MaxRequestMaxBytes of 1000");
    assert_false(parse("{\"expires\":61000000000}", &c, &r, &code, desc));
    assert_string_equal(desc, "Exceeded MaxRequestExpires of 1m0s");
    c.max_expires_ms = 1500;
    assert_false(parse("{\"expires\":2000000000}", &c, &r, &code, desc));
    assert_string_equal(desc, "Exceeded MaxRequestExpires of 1.5s");
    assert_false(parse("{\"expires\":1000000000,\"idle_heartbeat\":600000000}", &c, &r, &code, desc));
    assert_string_equal(desc, "Bad Request - heartbeat value too large");
    assert_false(parse("{\"idle_heartbeat\":1000}", &c, &r, &code, desc)); /* under 100 ms */
    assert_int_equal(code, 400);
    dm_pull_cfg open = cfg0();
    assert_false(parse("{\"batch\":1000001}", &open, &r, &code, desc));
    assert_string_equal(desc, "Exceeded MaxRequestBatch of 1000000");
    char longreply[FX_PULL_REPLY_MAX + 2];
    memset(longreply, 'a', sizeof longreply - 1);
    longreply[sizeof longreply - 1] = '\0';
    assert_false(dm_pull_parse("", 0, longreply, &open, 0, &r, &code, desc, sizeof desc));
    assert_int_equal(code, 400);
}

/* The wait queue: bounded by max_waiting, served head first, a served request goes to the back
 * (JetStream's order), removal keeps the order of the others. */
static void queue(void **state)
{
    (void)state;
    dm_pull p;
    memset(&p, 0, sizeof p);
    p.cfg = cfg0();
    p.wq = calloc((size_t)p.cfg.max_waiting, sizeof *p.wq);
    assert_non_null(p.wq);
    dm_pull_req r;
    memset(&r, 0, sizeof r);
    for (int i = 0; i < 4; i++) {
        snprintf(r.reply, sizeof r.reply, "r%d", i);
        assert_true(dm_pull_push(&p, &r));
    }
    assert_false(dm_pull_push(&p, &r)); /* max_waiting */
    dm_pull_rotate(&p);                 /* r0 served, wants more */
    assert_string_equal(dm_pull_at(&p, 0)->reply, "r1");
    assert_string_equal(dm_pull_at(&p, 3)->reply, "r0");
    dm_pull_remove(&p, 1); /* r2 expired */
    assert_int_equal(p.n, 3);
    assert_string_equal(dm_pull_at(&p, 0)->reply, "r1");
    assert_string_equal(dm_pull_at(&p, 1)->reply, "r3");
    assert_string_equal(dm_pull_at(&p, 2)->reply, "r0");
    dm_pull_remove(&p, 0);
    assert_string_equal(dm_pull_at(&p, 0)->reply, "r3");
    snprintf(r.reply, sizeof r.reply, "r4");
    assert_true(dm_pull_push(&p, &r)); /* wraps around the ring */
    assert_true(dm_pull_push(&p, &r));
    assert_false(dm_pull_push(&p, &r));
    assert_string_equal(dm_pull_at(&p, 3)->reply, "r4");
    free(p.wq);
}

/* The consumer's stored config (jsapi.c) into the claim's settings; the channel fills gaps. */
static void config(void **state)
{
    (void)state;
    fx_chan_settings cs;
    memset(&cs, 0, sizeof cs);
    cs.ack_wait_ms = 30000;
    cs.max_deliver = 5;
    cs.max_ack_pending = 1000;
    cs.backoff_ms[0] = 200;
    cs.n_backoff = 1;
    cs.nak_delay_ms = 700;
    cJSON *c = cJSON_Parse("{\"ack_wait\":2000000000,\"max_deliver\":3,\"max_waiting\":64,"
                           "\"backoff\":[1000000000,5000000000],\"max_batch\":10}");
    assert_non_null(c);
    dm_pull_cfg pc;
    dm_pull_cfg_from_json(c, &cs, &pc);
    assert_int_equal(pc.ack_wait_ms, 2000);
    assert_int_equal(pc.max_deliver, 3);
    assert_int_equal(pc.max_ack_pending, 1000);
    assert_int_equal(pc.max_waiting, 64);
    assert_int_equal(pc.max_batch, 10);
    assert_int_equal(pc.n_backoff, 2);
    assert_int_equal(pc.backoff_ms[1], 5000);
    cJSON_Delete(c);
    c = cJSON_Parse("{}");
    dm_pull_cfg_from_json(c, &cs, &pc);
    assert_int_equal(pc.ack_wait_ms, 30000);
    assert_int_equal(pc.max_waiting, 512);
    assert_int_equal(pc.n_backoff, 1);
    assert_int_equal(pc.backoff_ms[0], 200);
    assert_int_equal(pc.nak_delay_ms, 700);
    cJSON_Delete(c);
    /* the consumer's own nak_delay replaces the channel's NAK policy (no backoff list) */
    c = cJSON_Parse("{\"nak_delay\":2000000000}");
    dm_pull_cfg_from_json(c, &cs, &pc);
    assert_int_equal(pc.nak_delay_ms, 2000);
    assert_int_equal(pc.n_backoff, 0);
    cJSON_Delete(c);
    c = cJSON_Parse("{\"nak_delay\":2000000000,\"backoff\":[3000000000]}");
    dm_pull_cfg_from_json(c, &cs, &pc);
    assert_int_equal(pc.nak_delay_ms, 2000);
    assert_int_equal(pc.n_backoff, 1);
    assert_int_equal(pc.backoff_ms[0], 3000);
    cJSON_Delete(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(bodies),
        cmocka_unit_test(refusals),
        cmocka_unit_test(queue),
        cmocka_unit_test(config),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
