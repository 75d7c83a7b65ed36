/* Keyed BLAKE2b, after the reference implementation (CC0 1.0); see blake2b.h. */
#include "blake2b.h"

#include <string.h>

static const uint64_t IV[8] = {
    0x6a09e667f3bcc908ULL, 0xbb67ae8584caa73bULL, 0x3c6ef372fe94f82bULL,
    0xa54ff53a5f1d36f1ULL, 0x510e527fade682d1ULL, 0x9b05688c2b3e6c1fULL,
    0x1f83d9abfb41bd6bULL, 0x5be0cd19137e2179ULL,
};

static const uint8_t SIGMA[12][16] = {
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
    {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3},
    {11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4},
    {7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8},
    {9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13},
    {2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9},
    {12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11},
    {13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10},
    {6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5},
    {10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0},
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
    {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3},
};

static inline uint64_t load64(const uint8_t *p) {
    return (uint64_t)p[0] | ((uint64_t)p[1] << 8) | ((uint64_t)p[2] << 16) |
           ((uint64_t)p[3] << 24) | ((uint64_t)p[4] << 32) | ((uint64_t)p[5] << 40) |
           ((uint64_t)p[6] << 48) | ((uint64_t)p[7] << 56);
}

static inline uint64_t rotr64(uint64_t x, unsigned n) { return (x >> n) | (x << (64 - n)); }

#define G(r, i, a, b, c, d)                      \
    do {                                         \
        a = a + b + m[SIGMA[r][2 * (i)]];        \
        d = rotr64(d ^ a, 32);                   \
        c = c + d;                               \
        b = rotr64(b ^ c, 24);                   \
        a = a + b + m[SIGMA[r][2 * (i) + 1]];    \
        d = rotr64(d ^ a, 16);                   \
        c = c + d;                               \
        b = rotr64(b ^ c, 63);                   \
    } while (0)

/* Compress one 128-byte block; ``t`` is the byte counter after this block, ``last`` 1 for the
 * final block. */
static void compress(uint64_t h[8], const uint8_t block[128], uint64_t t, int last) {
    uint64_t m[16], v[16];
    for (int i = 0; i < 16; i++) m[i] = load64(block + 8 * i);
    for (int i = 0; i < 8; i++) {
        v[i] = h[i];
        v[i + 8] = IV[i];
    }
    v[12] ^= t;  /* messages here are far below 2^64 bytes: the high counter word stays 0 */
    if (last) v[14] = ~v[14];
    /* The rounds written out (as the reference implementation does): each round's message
     * schedule is then a constant and m[] stays in registers, not a table lookup per word. */
#define ROUND(r)                                 \
    do {                                         \
        G(r, 0, v[0], v[4], v[8], v[12]);        \
        G(r, 1, v[1], v[5], v[9], v[13]);        \
        G(r, 2, v[2], v[6], v[10], v[14]);       \
        G(r, 3, v[3], v[7], v[11], v[15]);       \
        G(r, 4, v[0], v[5], v[10], v[15]);       \
        G(r, 5, v[1], v[6], v[11], v[12]);       \
        G(r, 6, v[2], v[7], v[8], v[13]);        \
        G(r, 7, v[3], v[4], v[9], v[14]);        \
    } while (0)
    ROUND(0);
    ROUND(1);
    ROUND(2);
    ROUND(3);
    ROUND(4);
    ROUND(5);
    ROUND(6);
    ROUND(7);
    ROUND(8);
    ROUND(9);
    ROUND(10);
    ROUND(11);
#undef ROUND
    for (int i = 0; i < 8; i++) h[i] ^= v[i] ^ v[i + 8];
}

int sdp_blake2b_init_key(sdp_blake2b_key *k, size_t outlen, const uint8_t *key, size_t keylen) {
    return sdp_blake2b_init_key_person(k, outlen, key, keylen, NULL);
}

int sdp_blake2b_init_key_person(sdp_blake2b_key *k, size_t outlen, const uint8_t *key,
                                size_t keylen, const uint8_t *person) {
    if (outlen < 1 || outlen > 64 || keylen > 64) return -1;
    memcpy(k->h, IV, sizeof IV);
    k->h[0] ^= 0x01010000ULL ^ ((uint64_t)keylen << 8) ^ (uint64_t)outlen;
    if (person != NULL) {  /* the parameter block's bytes 48..63 */
        k->h[6] ^= load64(person);
        k->h[7] ^= load64(person + 8);
    }
    k->outlen = outlen;
    k->keyed = keylen > 0;
    memcpy(k->h0, k->h, sizeof k->h);
    memset(k->block, 0, sizeof k->block);
    if (keylen > 0) {
        memcpy(k->block, key, keylen);
        /* Not the final block when a message follows (an empty message: hash_words). */
        compress(k->h, k->block, 128, 0);
    }
    return 0;
}

static void hash_words(const sdp_blake2b_key *k, const uint8_t *data, size_t len,
                       uint64_t h[8]) {
    uint64_t t = k->keyed ? 128 : 0;
    if (len == 0) {  /* the key block (or an empty block) is the last block */
        memcpy(h, k->h0, sizeof k->h0);
        compress(h, k->block, t, 1);
        return;
    }
    memcpy(h, k->h, sizeof k->h);
    while (len > 128) {
        t += 128;
        compress(h, data, t, 0);
        data += 128;
        len -= 128;
    }
    uint8_t block[128];
    memset(block, 0, sizeof block);
    memcpy(block, data, len);
    t += len;
    compress(h, block, t, 1);
}

void sdp_blake2b(const sdp_blake2b_key *k, const uint8_t *data, size_t len, uint8_t *out) {
    uint64_t h[8];
    uint8_t buf[64];
    hash_words(k, data, len, h);
    for (int i = 0; i < 8; i++)
        for (int j = 0; j < 8; j++) buf[8 * i + j] = (uint8_t)(h[i] >> (8 * j));
    memcpy(out, buf, k->outlen);
}

void sdp_blake2b_words(const sdp_blake2b_key *k, const uint8_t *data, size_t len,
                       uint64_t *w0, uint64_t *w1) {
    uint64_t h[8];
    hash_words(k, data, len, h);
    *w0 = h[0];
    *w1 = h[1];
}
