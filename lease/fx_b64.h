/* fx_b64.h -- standard base64 with padding (RFC 4648 §4), as etcd's JSON gateway requires.
 * Pure functions; thread-safe; no allocation except in fx_b64_*_alloc. */
#ifndef FX_B64_H
#define FX_B64_H

#include <stddef.h>
#include <stdint.h>

/* Encoded length of n bytes, without the NUL. */
size_t fx_b64_enc_len(size_t n);
/* Encode n bytes into out (needs fx_b64_enc_len(n)+1 bytes); NUL-terminates; returns the length. */
size_t fx_b64_encode(const uint8_t *in, size_t n, char *out);
/* Upper bound of the decoded length of an encoded string of length n. */
size_t fx_b64_dec_maxlen(size_t n);
/* Decode strictly (standard alphabet, padding required, no whitespace). Writes into out (needs
 * fx_b64_dec_maxlen(n) bytes, may be NULL when n == 0). Returns 0 and sets *out_len on success,
 * -1 on invalid input. */
int fx_b64_decode(const char *in, size_t n, uint8_t *out, size_t *out_len);

#endif
