/* fx_resp.h -- Redis request encoding (RESP2: a command is an array of bulk strings) straight into
 * one caller-sized buffer, for pipelines that carry large values (kv_redis.c's puts): each value
 * is copied once, into the bytes that go on the wire, where formatting through hiredis copies it
 * three times (an argv member, hiredis's formatted command, its output buffer).
 *
 * Use: add up fx_resp_arr_size / fx_resp_bulk_size (or fx_resp_cmd_size) for what will be
 * written, allocate that many bytes, then write the parts in order; each writer returns the end
 * of what it wrote. A bulk string may be written in pieces: fx_resp_bulk_head(len), then exactly
 * len bytes by the caller, then fx_resp_bulk_end. The output is byte for byte what hiredis's
 * redisFormatCommandArgv makes of the same argv (tests/unit/test_resp.c checks it).
 *
 * Ownership: the caller owns the buffer; nothing here allocates. Thread rules: none (pure
 * functions on the caller's memory).
 */
#ifndef FX_LEASE_RESP_H
#define FX_LEASE_RESP_H

#include <stddef.h>

/* Bytes of "*<n>\r\n". */
size_t fx_resp_arr_size(size_t n);
/* Bytes of "$<len>\r\n" + len bytes + "\r\n". */
size_t fx_resp_bulk_size(size_t len);
/* Bytes of a whole command: its array header and argc bulk strings of lens[i] bytes. */
size_t fx_resp_cmd_size(int argc, const size_t *lens);

char *fx_resp_arr(char *p, size_t n);
char *fx_resp_bulk(char *p, const void *data, size_t len);
char *fx_resp_bulk_head(char *p, size_t len);
char *fx_resp_bulk_end(char *p);
char *fx_resp_cmd(char *p, int argc, const char *const *argv, const size_t *lens);

#endif
