/* make_corpus.c -- writes the seed corpora of the fuzz targets (tests/fuzz/corpus/<name>/), a
 * handful of valid inputs each, built with the project's own encoders where the format is
 * binary. Not part of `make fuzz`: run it after a format change and commit the result:
 *   make fuzz-corpus */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "flatdict.h"
#include "jsack.h"
#include "segment.h"

static const char *root;

static void put(const char *target, const char *name, const void *data, size_t len)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", root, target);
    if (mkdir(path, 0755) != 0 && errno != EEXIST) {
        perror(path);
        exit(1);
    }
    snprintf(path, sizeof path, "%s/%s/%s", root, target, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, len, f) != len || fclose(f) != 0) {
        perror(path);
        exit(1);
    }
}

static void puts_(const char *target, const char *name, const char *text)
{
    put(target, name, text, strlen(text));
}

/* etcd bodies: the selector byte of fuzz_etcd_json.c, then the body */
static void ej(const char *name, int sel, const char *body)
{
    size_t n = strlen(body);
    char *b = malloc(n + 1);
    b[0] = (char)sel;
    memcpy(b + 1, body, n);
    put("etcd_json", name, b, n + 1);
    free(b);
}

/* etcd gRPC answers: the selector byte of fuzz_etcd_pb.c, then the message (hex, as captured
 * from etcd 3.4: range of a kv with a lease, put with prev_kv, delete with prev_kvs, a txn of a
 * range and a put; the frame seed keeps its 5-byte prefix) */
static void epb(const char *name, int sel, const char *hex)
{
    size_t n = strlen(hex) / 2;
    uint8_t *b = malloc(n + 1);
    b[0] = (uint8_t)sel;
    for (size_t i = 0; i < n; i++) {
        unsigned v = 0;
        sscanf(hex + 2 * i, "%2x", &v);
        b[1 + i] = (uint8_t)v;
    }
    put("etcd_pb", name, b, n + 1);
    free(b);
}

#define PB_HDR "0a1a08b298eaf1948386fccd0110cdd2918bd2b881cf8e01"

#define HDR(rev) "\"header\":{\"cluster_id\":\"1\",\"member_id\":\"2\",\"revision\":\"" rev "\",\"raft_term\":\"3\"}"

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s <corpus dir>\n", argv[0]);
        return 2;
    }
    root = argv[1];
    mkdir(root, 0755);

    /* etcd gRPC answers */
    epb("range", 0, PB_HDR "1806200212110a022f611002180620052a0568656c6c6f2001");
    epb("put", 1, PB_HDR "18072002" "120d0a022f621007180720012a0176");
    epb("del", 2, PB_HDR "180820021001" "1a0d0a022f621007180720012a0176");
    epb("txn", 3, PB_HDR "18092002" "1001" "1a1b0a190a02180812110a022f611002180620052a0568656c6c6f2001"
                  "1a0612040a021809");
    epb("frame", 4, "000000001c" PB_HDR "18072002");

    /* config */
    puts_("config", "minimal.json",
          "{\"nats\":{\"url\":\"nats://127.0.0.1:4222\"},\"etcd\":{\"endpoints\":[\"http://127.0.0.1:2379\"]},"
          "\"channels\":[{\"name\":\"orders\",\"subjects\":[\"orders.>\"]}]}");
    puts_("config", "full.json",
          "{\"name\":\"b1\",\"nats\":{\"url\":\"nats://127.0.0.1:4222\",\"monitor_url\":\"http://127.0.0.1:8222\","
          "\"account\":\"$G\",\"leaf_url\":\"nats://127.0.0.1:7422\"},\"etcd\":{\"endpoints\":"
          "[\"http://127.0.0.1:2379\"],\"prefix\":\"/fx\"},\"kv\":{\"backend\":\"etcd\",\"endpoints\":"
          "[\"http://127.0.0.1:2379\"]},\"http\":{\"listen\":\"127.0.0.1:8080\"},\"defaults\":{\"ttl_seconds\":5,"
          "\"capacity\":100000,\"ack\":\"explicit\",\"ack_wait\":\"30s\",\"max_deliver\":5,\"max_ack_pending\":1000,"
          "\"backoff\":[\"200ms\",2,\"1m\"],\"release_after\":\"1s\",\"interest_poll\":\"200ms\"},\"channels\":"
          "[{\"name\":\"orders\",\"subjects\":[\"orders.>\"],\"deliver_prefix\":\"q.orders\",\"ack\":\"none\"},"
          "{\"name\":\"eu\",\"subjects\":[\"eu.*\",\"de.x\"],\"deliver_prefix\":\"q.eu\",\"ack_wait\":\"5m\"}]}");
    puts_("config", "bad_key.json", "{\"colour\":\"blue\"}");
    puts_("config", "duration.txt", "250ms");

    /* ack subject */
    fx_ack_meta m;
    memset(&m, 0, sizeof m);
    strcpy(m.bridge, "b1");
    strcpy(m.channel, "orders");
    strcpy(m.claim, "alice");
    m.delivered = 1;
    m.seq = 42;
    m.claim_seq = 7;
    m.ts_ns = 1700000000000000000LL;
    m.pending = 3;
    m.nonce = 0x1234abcdULL;
    char subj[FX_JSACK_SUBJECT_MAX];
    int n = fx_ack_subject_build(&m, subj, sizeof subj);
    put("ack_subject", "basic", subj, (size_t)n);
    m.delivered = 5;
    m.nonce = UINT64_MAX;
    m.seq = UINT64_MAX;
    n = fx_ack_subject_build(&m, subj, sizeof subj);
    put("ack_subject", "max", subj, (size_t)n);
    puts_("ack_subject", "foreign", "$JS.ACK.orders.consumer.1.2.3.1700000000000000000.0");

    /* ack body */
    puts_("ack_body", "ack", "+ACK");
    puts_("ack_body", "empty", "");
    puts_("ack_body", "nak", "-NAK");
    puts_("ack_body", "nak_delay", "-NAK {\"delay\":2000000000}");
    puts_("ack_body", "wpi", "+WPI");
    puts_("ack_body", "term", "+TERM poison message");

    /* FlatDict: an MQ record, and one entry of each type */
    fx_mq_msg mm = {FX_SLICE_STR("orders.eu"), FX_SLICE_STR("NATS/1.0\r\nA: b\r\n\r\n"), 1700000000000000000LL,
                    FX_SLICE_STR("hello")};
    fx_bytes b = {0};
    if (fx_mq_msg_encode(&mm, &b) != FX_OK) return 1;
    put("flatdict", "mq_msg", b.data, b.len);
    fx_bytes_free(&b);
    mm.headers = (fx_slice){NULL, 0};
    mm.data = (fx_slice){NULL, 0};
    if (fx_mq_msg_encode(&mm, &b) != FX_OK) return 1;
    put("flatdict", "mq_msg_empty", b.data, b.len);
    fx_bytes_free(&b);
    fx_fd_entry e[5];
    e[0] = fx_fd_int64("i", -5);
    e[1] = fx_fd_string("s", FX_SLICE_STR("text"));
    e[2] = fx_fd_bytes("b", (fx_slice){"\0\1\2", 3});
    memset(&e[3], 0, sizeof e[3]);
    e[3].key = FX_SLICE_STR("f");
    e[3].type = FX_FD_FLOAT64;
    e[3].f64 = 1.5;
    memset(&e[4], 0, sizeof e[4]);
    e[4].key = FX_SLICE_STR("t");
    e[4].type = FX_FD_BOOL;
    e[4].b = true;
    if (fx_fd_encode(e, 5, &b) != FX_OK) return 1;
    put("flatdict", "all_types", b.data, b.len);
    fx_bytes_free(&b);

    /* payload segment */
    fx_slice v[3] = {FX_SLICE_STR("one"), FX_SLICE_STR(""), FX_SLICE_STR("three!")};
    uint8_t seg[256];
    size_t sl = fx_seg_encode(v, 1, seg, sizeof seg);
    put("segment", "one", seg, sl);
    sl = fx_seg_encode(v, 3, seg, sizeof seg);
    put("segment", "three", seg, sl);

    /* leaf: server -> leaf protocol (the first byte also picks the read split) */
    const char *info = "INFO {\"server_id\":\"N1\",\"server_name\":\"n1\",\"version\":\"2.9.15\",\"headers\":true,"
                       "\"max_payload\":1048576,\"leafnode_urls\":[\"127.0.0.1:7422\"]}\r\n";
    char buf[2048];
    snprintf(buf, sizeof buf, "%s+OK\r\nPONG\r\n", info);
    puts_("leaf", "handshake", buf);
    snprintf(buf, sizeof buf,
             "%sPONG\r\nLS+ q.orders.alice workers 1\r\nLS+ q.orders.* other 3\r\nLS+ foo\r\n"
             "LS- q.orders.* other\r\nPONG\r\n",
             info);
    puts_("leaf", "queues", buf);
    snprintf(buf, sizeof buf,
             "%sPONG\r\nLMSG foo + bar q1 5\r\nhello\r\nHMSG foo | q1 12 14\r\nNATS/1.0\r\n\r\nhi\r\n"
             "-ERR 'Permissions Violation for Publish to \"x\"'\r\nINFO {\"max_payload\":100}\r\n",
             info);
    puts_("leaf", "messages", buf);
    puts_("leaf", "url", "nats://user:p%40ss@[::1]:7422/");

    /* etcd gateway bodies */
    ej("range", 0,
       "{" HDR("10") ",\"kvs\":[{\"key\":\"YXBwL2E=\",\"create_revision\":\"5\",\"mod_revision\":\"6\","
       "\"version\":\"2\",\"value\":\"djI=\",\"lease\":\"5241523851781477651\"}],\"more\":true,\"count\":\"3\"}");
    ej("put", 1, "{" HDR("11") ",\"prev_kv\":{\"key\":\"YQ==\",\"value\":\"Yg==\",\"mod_revision\":\"4\"}}");
    ej("del", 2, "{" HDR("12") ",\"deleted\":\"1\",\"prev_kvs\":[{\"key\":\"YQ==\",\"value\":\"Yg==\"}]}");
    ej("txn", 3,
       "{" HDR("13") ",\"succeeded\":true,\"responses\":[{\"response_range\":{\"header\":{\"revision\":\"13\"},"
       "\"kvs\":[{\"key\":\"dHhuL2s=\",\"create_revision\":\"13\",\"mod_revision\":\"13\",\"version\":\"1\","
       "\"value\":\"b25l\"}],\"count\":\"1\"}},{\"response_put\":{\"header\":{\"revision\":\"14\"}}},"
       "{\"response_delete_range\":{\"header\":{\"revision\":\"14\"},\"deleted\":\"1\"}}]}");
    ej("header", 4, "{" HDR("14") "}");
    ej("grant", 5, "{" HDR("15") ",\"ID\":\"7587862090427349000\",\"TTL\":\"5\"}");
    ej("keepalive", 6, "{\"result\":{" HDR("15") ",\"ID\":\"7587862090427349000\",\"TTL\":\"5\"}}");
    ej("timetolive", 7, "{" HDR("15") ",\"ID\":\"7587862090427349000\",\"TTL\":\"4\",\"grantedTTL\":\"5\"}");
    ej("status", 8, "{" HDR("16") ",\"version\":\"3.4.23\",\"dbSize\":\"24576\",\"leader\":\"2\","
                    "\"raftIndex\":\"20\",\"raftTerm\":\"3\"}");
    ej("auth", 9, "{" HDR("16") ",\"token\":\"abc.123\"}");
    ej("error", 10, "{\"error\":\"etcdserver: requested lease not found\",\"code\":5,"
                    "\"message\":\"etcdserver: requested lease not found\"}");
    ej("error_stream", 10, "{\"error\":{\"grpc_code\":14,\"http_code\":503,\"message\":\"unavailable\"}}");
    ej("grpc_name", 11, "PermissionDenied");
    ej("watch_created", 12, "{\"result\":{" HDR("1") ",\"watch_id\":\"0\",\"created\":true}}\n");
    ej("watch_events", 12,
       "{\"result\":{" HDR("20") ",\"events\":[{\"kv\":{\"key\":\"YQ==\",\"create_revision\":\"19\","
       "\"mod_revision\":\"20\",\"version\":\"2\",\"value\":\"Yg==\"},\"prev_kv\":{\"key\":\"YQ==\","
       "\"value\":\"YQ==\"}},{\"type\":\"DELETE\",\"kv\":{\"key\":\"Yw==\",\"mod_revision\":\"20\"}}]}}\r\n");
    ej("watch_canceled", 12, "{\"result\":{" HDR("30") ",\"canceled\":true,\"compact_revision\":\"25\","
                             "\"cancel_reason\":\"mvcc: required revision has been compacted\"}}\n");

    /* header blocks as stored */
    puts_("hdr", "two", "NATS/1.0\r\nA: b\r\nTrace-Id: 123\r\n\r\n");
    puts_("hdr", "ours", "NATS/1.0\r\nFluxon-Channel: other\r\nX:y\r\nX:  z\r\n\r\n");
    puts_("hdr", "status", "NATS/1.0 503\r\n\r\n");
    puts_("hdr", "odd", "NATS/1.0\r\nnocolon\r\n:empty\r\nk:\r\n");
    return 0;
}
