/* fx_b64.c -- standard base64 with padding (RFC 4648 §4), strict decoder.
 *
 * The decoder accepts exactly what etcd's Go gateway produces and accepts: the standard alphabet,
 * length a multiple of 4, '=' padding only in the last one or two positions of the last quantum,
 * and (canonical encoding, RFC 4648 §3.5) zero bits in the unused low bits before the padding.
 * URL-safe characters, whitespace, missing padding and anything after padding are rejected.
 */
#include "fx_b64.h"

static const char b64_alpha[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* Reverse table: 0..63 for alphabet characters, 0xff otherwise. Built at compile time. */
#define R(c) [(unsigned char)(c)]
static const uint8_t b64_rev[256] = {
    /* every entry not listed below is 0, fixed up by b64_val() through the +1 offset */
    R('A') = 1,  R('B') = 2,  R('C') = 3,  R('D') = 4,  R('E') = 5,  R('F') = 6,  R('G') = 7,
    R('H') = 8,  R('I') = 9,  R('J') = 10, R('K') = 11, R('L') = 12, R('M') = 13, R('N') = 14,
    R('O') = 15, R('P') = 16, R('Q') = 17, R('R') = 18, R('S') = 19, R('T') = 20, R('U') = 21,
    R('V') = 22, R('W') = 23, R('X') = 24, R('Y') = 25, R('Z') = 26, R('a') = 27, R('b') = 28,
    R('c') = 29, R('d') = 30, R('e') = 31, R('f') = 32, R('g') = 33, R('h') = 34, R('i') = 35,
    R('j') = 36, R('k') = 37, R('l') = 38, R('m') = 39, R('n') = 40, R('o') = 41, R('p') = 42,
    R('q') = 43, R('r') = 44, R('s') = 45, R('t') = 46, R('u') = 47, R('v') = 48, R('w') = 49,
    R('x') = 50, R('y') = 51, R('z') = 52, R('0') = 53, R('1') = 54, R('2') = 55, R('3') = 56,
    R('4') = 57, R('5') = 58, R('6') = 59, R('7') = 60, R('8') = 61, R('9') = 62, R('+') = 63,
    R('/') = 64,
};
#undef R

/* Value 0..63 of an alphabet character, or -1. */
static int b64_val(char ch) { return (int)b64_rev[(unsigned char)ch] - 1; }

size_t fx_b64_enc_len(size_t n) { return (n + 2) / 3 * 4; }

size_t fx_b64_encode(const uint8_t *in, size_t n, char *out)
{
    size_t i = 0, o = 0;
    for (; i + 3 <= n; i += 3) {
        uint32_t v = (uint32_t)in[i] << 16 | (uint32_t)in[i + 1] << 8 | in[i + 2];
        out[o++] = b64_alpha[v >> 18 & 63];
        out[o++] = b64_alpha[v >> 12 & 63];
        out[o++] = b64_alpha[v >> 6 & 63];
        out[o++] = b64_alpha[v & 63];
    }
    if (n - i == 1) {
        uint32_t v = (uint32_t)in[i] << 16;
        out[o++] = b64_alpha[v >> 18 & 63];
        out[o++] = b64_alpha[v >> 12 & 63];
        out[o++] = '=';
        out[o++] = '=';
    } else if (n - i == 2) {
        uint32_t v = (uint32_t)in[i] << 16 | (uint32_t)in[i + 1] << 8;
        out[o++] = b64_alpha[v >> 18 & 63];
        out[o++] = b64_alpha[v >> 12 & 63];
        out[o++] = b64_alpha[v >> 6 & 63];
        out[o++] = '=';
    }
    out[o] = '\0';
    return o;
}

size_t fx_b64_dec_maxlen(size_t n) { return n / 4 * 3; }

int fx_b64_decode(const char *in, size_t n, uint8_t *out, size_t *out_len)
{
    if (n % 4 != 0) return -1;
    size_t o = 0;
    for (size_t i = 0; i < n; i += 4) {
        int a = b64_val(in[i]), b = b64_val(in[i + 1]);
        if (a < 0 || b < 0) return -1;
        int last = (i + 4 == n);
        if (last && in[i + 2] == '=') {
            /* "xx==": one byte; the low 4 bits of b must be zero */
            if (in[i + 3] != '=' || (b & 0x0f)) return -1;
            out[o++] = (uint8_t)(a << 2 | b >> 4);
            break;
        }
        int c = b64_val(in[i + 2]);
        if (c < 0) return -1;
        if (last && in[i + 3] == '=') {
            /* "xxx=": two bytes; the low 2 bits of c must be zero */
            if (c & 0x03) return -1;
            out[o++] = (uint8_t)(a << 2 | b >> 4);
            out[o++] = (uint8_t)((b & 0x0f) << 4 | c >> 2);
            break;
        }
        int d = b64_val(in[i + 3]);
        if (d < 0) return -1;
        out[o++] = (uint8_t)(a << 2 | b >> 4);
        out[o++] = (uint8_t)((b & 0x0f) << 4 | c >> 2);
        out[o++] = (uint8_t)((c & 0x03) << 6 | d);
    }
    *out_len = o;
    return 0;
}
